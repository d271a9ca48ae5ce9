#!/usr/bin/python3
"""Renders chat templates as transformers' apply_chat_template does: Python Jinja2 in an ImmutableSandboxedEnvironment
with trim_blocks, lstrip_blocks, loop controls, the {% generation %} tag, its own tojson filter (no HTML escaping,
ensure_ascii off) and the raise_exception and strftime_now globals (transformers/utils/chat_template_utils.py).

  template_reference.py golden            rewrite tests/data/chat/golden/<template>.jsonl (conversations.json) and
                                          tests/data/chat/jinja_cases.golden.jsonl (jinja_cases.json)
  template_reference.py check CLI         live: every golden template and every case of jinja_cases.json, rendered
                                          here and by `CLI template`; exit 0 same, 1 different, 77 no jinja2
  template_reference.py render T M        print one render (T: tokenizer_config.json, M: messages file as for CLI)
"""

import datetime
import json
import os
import subprocess
import sys
import tempfile

try:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:  # the live check skips; `apt-get install python3-jinja2`
    jinja2 = None

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHAT = os.path.join(ROOT, "tests", "data", "chat")


def environment():
    class Generation(jinja2.ext.Extension):
        # transformers' AssistantTracker: {% generation %}...{% endgeneration %} renders its body unchanged.
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

        def _render(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(source, context):
    """{"output": text} or {"error": message}, as the golden files hold them."""
    try:
        return {"output": environment().from_string(source).render(**context)}
    except Exception as e:  # any failure is the reference's error; colibri must fail too
        return {"error": f"{type(e).__name__}: {e}"}


def context_of(meta, case):
    # apply_chat_template passes tools and documents always, None when not given.
    context = {"messages": case["messages"], "add_generation_prompt": case.get("add_generation_prompt", False),
               "bos_token": meta["bos"], "eos_token": meta["eos"], "tools": case.get("tools"), "documents": None}
    context.update(case.get("extra", {}))
    return context


def golden_templates():
    names = sorted(f[:-5] for f in os.listdir(os.path.join(CHAT, "golden")) if f.endswith(".json"))
    return [(n, json.load(open(os.path.join(CHAT, "golden", n + ".json"), encoding="utf-8"))) for n in names]


def conversations():
    return json.load(open(os.path.join(CHAT, "conversations.json"), encoding="utf-8"))["cases"]


def snippet_cases():
    """jinja_cases.json: {"name", "template", "context"} each; small templates for the semantics one by one."""
    return json.load(open(os.path.join(CHAT, "jinja_cases.json"), encoding="utf-8"))["cases"]


BUILTIN_SPECIALS = {"llama2": ("<s>", "</s>"), "mistral": ("<s>", "</s>"), "gpt-oss": ("<|startoftext|>", "<|return|>"),
                    "chatml": ("", "<|im_end|>")}


def snippet_context(case):
    return {"tools": None, "documents": None, **case.get("context", {})}


def write_golden():
    # colibri's built-in templates are read afresh from tests/data/chat/builtin (they change with the code); the
    # models' own templates are kept in golden/<name>.json, so the tests need no tokenizer files.
    builtin_dir = os.path.join(CHAT, "builtin")
    for file in sorted(os.listdir(builtin_dir)):
        name = file[:-len(".jinja")]
        bos, eos = BUILTIN_SPECIALS.get(name, ("", ""))
        source = open(os.path.join(builtin_dir, file), encoding="utf-8").read()
        with open(os.path.join(CHAT, "golden", f"builtin_{name}.json"), "w", encoding="utf-8") as f:
            f.write(json.dumps({"source": source, "bos": bos, "eos": eos}, ensure_ascii=False, separators=(",", ":")) + "\n")
    for name, meta in golden_templates():
        lines = [json.dumps({"case": c["name"], **render(meta["source"], context_of(meta, c))}, ensure_ascii=False,
                            separators=(",", ":"))
                 for c in conversations()]
        with open(os.path.join(CHAT, "golden", name + ".jsonl"), "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        print(f"{name}: {len(lines)} cases")
    lines = [json.dumps({"case": c["name"], **render(c["template"], snippet_context(c))}, ensure_ascii=False,
                        separators=(",", ":")) for c in snippet_cases()]
    with open(os.path.join(CHAT, "jinja_cases.golden.jsonl"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print(f"jinja_cases: {len(lines)} cases")


def run_cli(cli, tmp, name, source, context):
    config = os.path.join(tmp, "tokenizer_config.json")
    messages = os.path.join(tmp, "messages.json")
    ctx = dict(context)
    with open(config, "w", encoding="utf-8") as f:
        json.dump({"chat_template": source, "bos_token": ctx.pop("bos_token", ""),
                   "eos_token": ctx.pop("eos_token", "")}, f, ensure_ascii=False)
    ctx.setdefault("messages", [])
    with open(messages, "w", encoding="utf-8") as f:
        json.dump(ctx, f, ensure_ascii=False)
    return subprocess.run([cli, "template", "--tokenizer-config", config, "--messages", messages],
                          capture_output=True, text=True, errors="replace")


def check(cli):
    failures = compared = 0
    with tempfile.TemporaryDirectory(prefix="colibri-jinja2-") as tmp:
        work = [(f"{n}/{c['name']}", meta["source"], context_of(meta, c)) for n, meta in golden_templates()
                for c in conversations()]
        work = [(n, src, ctx, None) for n, src, ctx in work]
        # A case Python refuses names the words colibri's error must have, so that another failure does not pass.
        work += [(f"case/{c['name']}", c["template"], snippet_context(c), c.get("colibri_error"))
                 for c in snippet_cases()]
        for name, source, context, words in work:
            ref = render(source, context)
            run = run_cli(cli, tmp, name, source, context)
            compared += 1
            if "error" in ref:
                ok = run.returncode != 0 and (words is None or words in run.stderr)
            else:
                ok = run.returncode == 0 and run.stdout == ref["output"]
            if not ok:
                failures += 1
                print(f"MISMATCH {name}: jinja2 {json.dumps(ref, ensure_ascii=False)[:300]}")
                print(f"  colibri (rc={run.returncode}): {json.dumps(run.stdout, ensure_ascii=False)[:300]} "
                      f"{run.stderr.strip()[:300]}")
    print(f"{compared - failures} passed, {failures} failed")
    return 0 if failures == 0 else 1


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in ("golden", "check", "render"):
        print(__doc__, file=sys.stderr)
        return 2
    if jinja2 is None:
        print("skip: python3 has no jinja2 (apt-get install python3-jinja2)", file=sys.stderr)
        return 77
    if sys.argv[1] == "golden":
        write_golden()
        return 0
    if sys.argv[1] == "check":
        return check(sys.argv[2])
    config = json.load(open(sys.argv[2], encoding="utf-8"))
    context = json.load(open(sys.argv[3], encoding="utf-8"))
    context.update({k: config.get(k, "") for k in ("bos_token", "eos_token")})
    result = render(config["chat_template"], context)
    print(result.get("output", result.get("error")), end="")
    return 0 if "output" in result else 1


if __name__ == "__main__":
    sys.exit(main())
