#!/usr/bin/python3
"""SIGKILL (and SIGINT, SIGTERM, SIGHUP) `colibri-cli convert` at random points: the output path must then either not exist or hold a complete
model that `inspect --verify` accepts, and any hidden partial directory left behind must not pass as a model
unless it verifies too. With --force over an existing model, the output must always verify (old or new model).

usage: convert_sigkill_test.py COLIBRI_CLI MAKE_TINY_MODEL_PY WORK_DIR [ROUNDS]
"""
import os
import random
import shutil
import signal
import subprocess
import sys
import time


def main():
    cli, generator, work = sys.argv[1], sys.argv[2], sys.argv[3]
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 10
    seed = int(os.environ.get("COLIBRI_TEST_SEED", time.time()))
    rng = random.Random(seed)
    print(f"seed {seed}")
    src = os.path.join(work, "src 模型")
    if not os.path.exists(os.path.join(src, "config.json")):
        subprocess.run([sys.executable, generator, "--arch", "mixtral", "--shape", "medium", "--dtype", "f32",
                        "--out", src], check=True, stderr=subprocess.DEVNULL)
    outdir = os.path.join(work, "out 模型")
    os.makedirs(outdir, exist_ok=True)
    out = os.path.join(outdir, "mixtral medium")

    def convert_cmd(force=False):
        return [cli, "convert", "--quiet", "-i", src, "-o", out, "-q", "f16", "--threads", "1"] + (["--force"] if force else [])

    def verifies(path):
        r = subprocess.run([cli, "inspect", path, "--verify", "--json"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return r.returncode == 0

    def accepted(path):
        r = subprocess.run([cli, "inspect", path], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return r.returncode == 0

    def partials():
        return [os.path.join(outdir, n) for n in os.listdir(outdir) if ".colibri-partial-" in n]

    shutil.rmtree(out, ignore_errors=True)
    t0 = time.monotonic()
    subprocess.run(convert_cmd(), check=True, stdout=subprocess.DEVNULL)
    duration = time.monotonic() - t0
    assert verifies(out), "a complete conversion must verify"
    print(f"full conversion takes {duration:.2f}s")

    failures = []
    outcomes = {"absent": 0, "complete": 0}
    for i in range(rounds):
        shutil.rmtree(out, ignore_errors=True)
        p = subprocess.Popen(convert_cmd(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.0, duration * 1.05))
        p.send_signal(signal.SIGKILL)
        p.wait()
        if os.path.exists(out):
            outcomes["complete"] += 1
            if not verifies(out):
                failures.append(f"round {i}: {out} exists after SIGKILL but does not verify")
        else:
            outcomes["absent"] += 1
        for d in partials():
            if accepted(d) and not verifies(d):
                failures.append(f"round {i}: partial directory {d} is accepted by inspect but does not verify")
    print(f"plain conversions killed: {outcomes}")

    # --force over an existing model: never without a whole model at the output path.
    shutil.rmtree(out, ignore_errors=True)
    subprocess.run(convert_cmd(), check=True, stdout=subprocess.DEVNULL)
    for i in range(max(3, rounds // 2)):
        p = subprocess.Popen(convert_cmd(force=True), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.0, duration * 1.05))
        p.send_signal(signal.SIGKILL)
        p.wait()
        if not verifies(out):
            failures.append(f"force round {i}: {out} does not verify after SIGKILL")

    # Ctrl-C while it writes: the conversion stops, removes its partial directory and keeps the old model.
    def writing():
        """A --force conversion that has begun its partial directory, some way into its work; the partials before."""
        before = set(partials())
        p = subprocess.Popen(convert_cmd(force=True), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not set(partials()) - before:
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, duration * 0.5))
        return p, before

    for i in range(2):
        p, before = writing()
        p.send_signal(signal.SIGINT)
        _, err = p.communicate()
        print(f"sigint round {i}: exit {p.returncode}")
        if p.returncode == 130:
            if "conversion interrupted" not in err:
                failures.append(f"sigint round {i}: no word of the interruption: {err!r}")
            if set(partials()) - before:
                failures.append(f"sigint round {i}: partial directory left: {set(partials()) - before}")
        elif p.returncode != 0:
            failures.append(f"sigint round {i}: exit {p.returncode}: {err!r}")
        if not verifies(out):
            failures.append(f"sigint round {i}: {out} does not verify")

    # A signal that ends it at once (SIGTERM from systemd or docker, SIGHUP from a closed terminal, a second Ctrl-C):
    # its hidden partial directory goes with it, the old model stays.
    for sigs in ([signal.SIGTERM], [signal.SIGHUP], [signal.SIGINT, signal.SIGINT]):
        p, before = writing()
        for sig in sigs:
            p.send_signal(sig)
            time.sleep(0.002)
        _, err = p.communicate()
        name = "+".join(signal.Signals(sig).name for sig in sigs)
        print(f"{name} round: exit {p.returncode}")
        if p.returncode not in (0, 130, -sigs[-1]):
            failures.append(f"{name}: exit {p.returncode}: {err!r}")
        if set(partials()) - before:
            failures.append(f"{name}: partial directory left: {set(partials()) - before}")
        if not verifies(out):
            failures.append(f"{name}: {out} does not verify")

    # The next conversion sweeps the partial directories of dead conversions, also one whose process is a zombie
    # (killed, not yet reaped: here by this process, which waits for it only afterwards).
    before = set(partials())
    zombie = subprocess.Popen(convert_cmd(force=True), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not set(partials()) - before:
        time.sleep(0.005)
    zombie.send_signal(signal.SIGKILL)
    while time.monotonic() < deadline:  # until the kernel has made it a zombie
        with open(f"/proc/{zombie.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                break
        time.sleep(0.005)
    subprocess.run(convert_cmd(force=True), check=True, stdout=subprocess.DEVNULL)
    zombie.wait()
    if partials():
        failures.append(f"partial directories left after a later conversion: {partials()}")
    if not verifies(out):
        failures.append("final conversion does not verify")

    for f in failures:
        print("FAIL:", f)
    print("ok" if not failures else f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
