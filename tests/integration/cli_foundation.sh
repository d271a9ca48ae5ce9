#!/usr/bin/env bash
# What issue 2 promises a user, checked through the real colibri-cli binary:
# plugins list shows pread and lru with scores; a misspelt profile key fails with its line and a
# suggestion; a plugin built for another ABI is refused with both versions named.
set -u
cli=$1
fixtures=$2
work=$3
server=$4
rm -rf "$work" && mkdir -p "$work"
failures=0
check() {  # check NAME EXPECTED_SUBSTRING OUTPUT
  if [[ "$3" == *"$2"* ]]; then
    echo "ok   - $1"
  else
    echo "FAIL - $1: expected to find: $2"
    echo "---- output ----"; echo "$3"; echo "----------------"
    failures=$((failures + 1))
  fi
}
expect_rc() {  # expect_rc NAME WANT GOT
  if [ "$2" = "$3" ]; then echo "ok   - $1 (exit $3)"; else echo "FAIL - $1: exit $3, wanted $2"; failures=$((failures + 1)); fi
}

out=$("$cli" plugins list 2>&1); rc=$?
expect_rc "plugins list succeeds" 0 $rc
check "pread is listed with its score" "storage  pread         1.0.0    100" "$out"
check "lru is listed with its score" "cache    lru           1.0.0    100" "$out"

# A plugin option is checked against the plugin the profile selects, as in a run; a selected plugin that is not
# installed is no error here (listing the plugins is how one finds that out).
out=$("$cli" plugins list --set storage.queue_depht=8 2>&1); rc=$?
expect_rc "plugins list with a misspelt plugin option fails" 1 $rc
check "the misspelt option is named with the plugin's" "unknown key 'storage.queue_depht'; did you mean 'storage.queue_depth'?" "$out"
out=$("$cli" model stripe nosuch-model --to "$work/disk2" --set cache.bogus=1 2>&1); rc=$?
expect_rc "model stripe with an unknown plugin option fails" 1 $rc
check "model stripe names the option before anything else" "unknown key 'cache.bogus'" "$out"
out=$("$cli" plugins list --set compute.backend=nosuch 2>&1); rc=$?
expect_rc "plugins list with a backend that is not installed still lists" 0 $rc
check "and lists the others" "storage  pread" "$out"

out=$("$cli" plugins list --json 2>&1); rc=$?
expect_rc "plugins list --json succeeds" 0 $rc
check "json names pread" '"name": "pread"' "$out"
check "json has capabilities" '"direct_io"' "$out"

cat > "$work/typo.yaml" <<'YAML'
extends: cpu
memory:
  expert_cache: 2G
  vram_buget: 1G
YAML
out=$("$cli" profile show --profile "$work/typo.yaml" 2>&1); rc=$?
expect_rc "misspelt profile key fails" 1 $rc
check "misspelt key: file, line and column" "typo.yaml:4:3: unknown key 'memory.vram_buget'" "$out"
check "misspelt key: suggestion" "did you mean 'vram_budget'?" "$out"

cat > "$work/plugin-typo.yaml" <<'YAML'
storage:
  plugin: pread
  thraeds: 4
YAML
out=$("$cli" profile show --profile "$work/plugin-typo.yaml" 2>&1); rc=$?
expect_rc "misspelt plugin option fails" 1 $rc
check "plugin option: line and suggestion" "plugin-typo.yaml:3:3: unknown key 'storage.thraeds'; did you mean 'storage.threads'?" "$out"

out=$("$cli" profile show --profile cpu --set storage.queue_depth=7 2>&1); rc=$?
expect_rc "profile show cpu" 0 $rc
check "cpu profile value with origin" "cache.policy = frequency" "$out"
check "origin of a profile value" "# profile cpu (" "$out"
check "--set wins and is named" "storage.queue_depth = 7" "$out"
check "--set origin" "command line --set storage.queue_depth=7" "$out"
check "plugin defaults are shown" "storage.threads = 0" "$out"

out=$(COLIBRI_PREFETCH_LAYERS=1 "$cli" profile show --prefetch-layers 3 2>&1)
check "flag beats environment" "prefetch.layers = 3" "$out"
out=$("$cli" profile show --prefetch-layers 3 --set prefetch.layers=1 2>&1); rc=$?
expect_rc "a flag and --set disagreeing fails as a usage error" 2 $rc
check "both named" "--prefetch-layers 3 and --set prefetch.layers=1 both set prefetch.layers to different values" "$out"
# A command-line value the profile refuses is a usage error (2); a profile file the loader refuses is not (1, above).
out=$("$cli" profile show --expert-cache-size 8Q 2>&1); rc=$?
expect_rc "a size flag that is no size fails as a usage error" 2 $rc
check "the flag and the key named" "--expert-cache-size 8Q: memory.expert_cache: '8Q' is not a size" "$out"
out=$("$cli" profile show --profile "$work/typo.yaml" --prefetch-layers 3 2>&1); rc=$?
expect_rc "a bad profile file stays exit 1 beside good flags" 1 $rc
out=$("$cli" profile show --expert-cache-size 4G --set memory.expert_cache=4096M 2>&1); rc=$?
expect_rc "a flag and --set giving one size in two spellings agree" 0 $rc
out=$("$cli" profile show --set prefetch.layers=1 --set prefetch.layers=2 2>&1)
check "the last --set wins" "prefetch.layers = 2" "$out"
out=$(COLIBRI_PREFETCH_LAYERS=1 "$cli" profile show 2>&1)
check "environment beats profile" "environment COLIBRI_PREFETCH_LAYERS" "$out"

out=$("$cli" profile show --profile nvme-raid 2>&1)
check "extends chain is shown" "extends " "$out"
out=$("$cli" profile list 2>&1); rc=$?
expect_rc "profile list succeeds" 0 $rc
check "profile list shows each profile's description" "experts striped over several NVMe drives" "$out"

out=$(COLIBRI_PLUGIN_PATH="$fixtures/wrong_abi" "$cli" plugins list 2>&1); rc=$?
expect_rc "plugins list with a broken plugin still succeeds" 0 $rc
check "wrong ABI refused with both versions" "was built for SDK ABI 2, this colibri has ABI 1" "$out"

out=$(COLIBRI_PLUGIN_PATH="$fixtures/wrong_abi" "$cli" profile show --set storage.plugin=fixture-abi 2>&1); rc=$?
check "selecting the refused plugin explains why" "looks like it but was refused" "$out"
# Every value is still shown, but a profile that cannot run here is not a success (a script checks it so).
expect_rc "profile show with a plugin that is not there fails" 1 $rc
check "values still shown" "storage.plugin = fixture-abi" "$out"
check "says it cannot run" "error: this profile cannot run here: selecting the storage plugin" "$out"
out=$("$cli" profile show --expert-cache-size 4GB 2>&1)
check "a size is shown in bytes too" "command line --expert-cache-size 4GB; 4294967296 bytes" "$out"
out=$("$cli" profile show --set compute.backend= 2>&1); rc=$?
expect_rc "an empty plugin name fails" 1 $rc
check "an empty plugin name is named" "compute.backend is empty (command line --set compute.backend=)" "$out"
# What a run would refuse, profile show refuses: a plugin's option check, a canonical choice.
out=$("$cli" profile show --set storage.chunk_kib=1 2>&1); rc=$?
expect_rc "profile show with a plugin option the plugin refuses fails" 1 $rc
check "the plugin's reason" "storage.chunk_kib is 1; use 0 (never split) or a multiple of 4" "$out"
out=$("$cli" profile show --set memory.vram_admission=sometimes 2>&1); rc=$?
expect_rc "a choice out of its set on the command line is a usage error" 2 $rc
check "the choices" "--set memory.vram_admission=sometimes: memory.vram_admission: 'sometimes' is not one of frequency, always" "$out"
# auto past a plugin whose create() fails: the plugin a run takes, checked and shown with its own options. Only the
# fixture knows storage.greeting, so io_uring and pread refuse it and a run takes fixture-good.
out=$(COLIBRI_PLUGIN_PATH="$fixtures/create_fails_high:$fixtures/good" "$cli" profile show --set storage.plugin=auto \
  --set storage.greeting=hello 2>/dev/null); rc=$?
expect_rc "profile show with auto past a failing create()" 0 $rc
check "auto names the plugin a run takes" "storage.plugin=auto; auto = fixture-good (score 50), as a run takes it" "$out"
check "and the one passed over" "fixture-fails-high (score 600)" "$out"
out=$(COLIBRI_PLUGIN_PATH="$fixtures/create_fails_high" "$cli" profile show --set storage.plugin=auto 2>/dev/null)
if [[ "$out" == *"storage plugin 'fixture-fails-high'"* ]]; then
  echo "FAIL - the defaults of a plugin auto passed over are shown:"; echo "$out"; failures=$((failures + 1))
else
  echo "ok   - the defaults shown are those of the plugin auto took"
fi
# Without fixture-good no plugin auto could take knows storage.greeting: a run fails, and so does profile show.
out=$(COLIBRI_PLUGIN_PATH="$fixtures/create_fails_high" "$cli" profile show --set storage.plugin=auto \
  --set storage.greeting=hello 2>&1); rc=$?
expect_rc "profile show fails where auto could take no plugin" 1 $rc
check "each plugin auto passed over is named" "no storage plugin that storage.plugin: auto could take was created" "$out"

out=$("$cli" profile show --set nonsense 2>&1); rc=$?
expect_rc "--set without = fails" 2 $rc
check "--set without = explains" "write --set KEY=VALUE" "$out"

out=$("$cli" profile show --ctx 100 2>&1); rc=$?
[ $rc -ne 0 ] && echo "ok   - profile show --ctx without --model refused" || { echo "FAIL - --ctx without --model accepted"; failures=$((failures + 1)); }
check "--ctx needs --model" "--ctx requires --model" "$out"

out=$("$cli" --log-level warn bogus 2>&1); rc=$?
expect_rc "an unknown command is a usage error" 2 $rc
check "an unknown command is named with the commands" "error: unknown command 'bogus'; the commands are plugins, profile" "$out"

# A mistyped command followed by options, or by another command, is named as the command (not "unknown option
# --model", nor as a command of the group that follows).
for words in "rn --model m" "foo cache" "foo cache stats --model m"; do
  out=$("$cli" $words 2>&1); rc=$?
  expect_rc "'$words' is a usage error" 2 $rc
  check "'$words' names its first word as the unknown command" "error: unknown command '${words%% *}'; the commands are" "$out"
done

# A group's command mistyped (with its options after it), or left out, is named with the group's commands.
out=$("$cli" cache stat --model m 2>&1); rc=$?
expect_rc "a group's unknown command is a usage error" 2 $rc
check "a group's unknown command is named, not its option" \
  "error: unknown command 'stat' for colibri-cli cache; the commands are stats, clear, warm (colibri-cli cache --help)" "$out"
out=$("$cli" profile 2>&1); rc=$?
expect_rc "a group without its command is a usage error" 2 $rc
check "a group without its command lists them" "error: colibri-cli profile needs a command: show, list" "$out"
out=$("$cli" cache --modle m 2>&1); rc=$?
check "a group's unknown option is still named as one" "error: unknown option --modle for colibri-cli cache" "$out"

# A default plugin place that is absent (most machines have no /usr/local/lib/colibri/plugins) is no news; a directory
# the user named that is absent is.
out=$("$cli" plugins list 2>&1 >/dev/null)
if [ ! -e /usr/local/lib/colibri/plugins ]; then
  if [[ "$out" == *"from local plugins"* ]]; then
    echo "FAIL - an absent default plugin directory warns: $out"; failures=$((failures + 1))
  else
    echo "ok   - an absent default plugin directory is not warned about"
  fi
fi
out=$(COLIBRI_PLUGIN_PATH=/nonexistent-plugins "$cli" plugins list 2>&1 >/dev/null)
check "an absent plugin directory the user named warns" "plugin directory /nonexistent-plugins (from COLIBRI_PLUGIN_PATH) does not exist" "$out"

# Every usage error is exit status 2 (not CLI11's 104, 105, 109...), so that a script tells it from a failed run.
out=$("$cli" convert --input a --output b --threads many 2>&1); rc=$?
expect_rc "a value of the wrong type is a usage error" 2 $rc
check "a value of the wrong type is named" "--threads" "$out"
out=$("$cli" plugins list --bogus 2>&1); rc=$?
expect_rc "an unknown flag is a usage error" 2 $rc
out=$("$cli" convert --output b 2>&1); rc=$?
expect_rc "a missing required flag is a usage error" 2 $rc
# A mistyped flag is named, not hidden behind the required one it was meant to be.
out=$("$cli" run --modle m -p hi 2>&1); rc=$?
expect_rc "a mistyped flag beside a missing required one is a usage error" 2 $rc
check "the mistyped flag is named with its command" "error: unknown option --modle for colibri-cli run (colibri-cli run --help)" "$out"
out=$("$cli" convert --help 2>&1); rc=$?
expect_rc "--help succeeds" 0 $rc
# The model, a positional or -m, is one entry in the help (CLI11 lists it under Positionals and Options).
out=$("$cli" inspect --help 2>&1)
check "a positional-or-flag argument is listed with both its names" "model,-m,--model TEXT REQUIRED" "$out"
[ "$(grep -c "Model directory" <<<"$out")" = 1 ] && echo "ok   - the model is listed once" ||
  { echo "FAIL - the model is listed more than once:"; echo "$out"; failures=$((failures + 1)); }

out=$("$cli" --log-level loud plugins list 2>&1); rc=$?
[ $rc -eq 2 ] && echo "ok   - bad log level refused (2)" || { echo "FAIL - bad log level: exit $rc"; failures=$((failures + 1)); }
# From the environment, the variable is named and the exit is 1, as for every other COLIBRI_* variable; the flag wins.
out=$(COLIBRI_LOG_LEVEL=loud "$cli" plugins list 2>&1); rc=$?
[ $rc -eq 1 ] && echo "ok   - bad COLIBRI_LOG_LEVEL exits 1" || { echo "FAIL - bad COLIBRI_LOG_LEVEL: exit $rc"; failures=$((failures + 1)); }
check "a bad COLIBRI_LOG_LEVEL is named" "COLIBRI_LOG_LEVEL: unknown log level 'loud'" "$out"
out=$(COLIBRI_LOG_LEVEL=loud "$cli" --log-level warn plugins list 2>&1); rc=$?
[ $rc -eq 0 ] && echo "ok   - --log-level wins over COLIBRI_LOG_LEVEL" || { echo "FAIL - --log-level beside a bad COLIBRI_LOG_LEVEL: exit $rc"; failures=$((failures + 1)); }
out=$(COLIBRI_LOG_LEVEL=loud "$server" --model /nonexistent 2>&1); rc=$?
[ $rc -eq 1 ] && echo "ok   - the server names a bad COLIBRI_LOG_LEVEL" || { echo "FAIL - server, bad COLIBRI_LOG_LEVEL: exit $rc"; failures=$((failures + 1)); }
check "the server names a bad COLIBRI_LOG_LEVEL" "COLIBRI_LOG_LEVEL: unknown log level 'loud'" "$out"

echo "$((failures == 0 ? 1 : 0)) passed, $failures failed" | sed 's/^1 passed/all passed/' >/dev/null
if [ $failures -ne 0 ]; then echo "$failures check(s) failed"; exit 1; fi
echo "all checks passed"
