"""kvdir's tokenizer parity check against real engines (issue 32), shared by the drivers of
scripts/vllm-e2e.sh and scripts/sglang-e2e.sh.

kvdir, started with --tokenizer_path, renders a fixed chat with its own template and tokenizer
when an engine's process becomes known, compares the ids with the engine's `POST /tokenize`,
and compares the engine's block size and served models with its listing. It reports
`engine.parity` in /v1/internal/instances, a WARN naming the first differing position, and
`kvdir_engine_parity_mismatch{instance=...}` in /metrics.

- check_agree: in the normal run, every engine agrees with kvdir (tokens "match", block size
  and model ok, the gauge 0);
- check_wrong_template: a second kvdir, started with a deliberately wrong chat template (the
  launcher the shell script wrote; WRONG_TEMPLATE is that template), must report "differ" for
  every engine, WARN with the position it names, and set the gauge to 1. It is stopped after.
Every check counts in the driver's `N passed, M failed`.
"""

import signal
import subprocess
import time

from vllm_chat import http

# The roles without the model's markers: the same words, other tokens. The shell scripts write
# this to the file the wrong-template kvdir gets as --chat_template.
WRONG_TEMPLATE = ("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
                  "assistant:")
GAUGE = "kvdir_engine_parity_mismatch"


def instances(url):
    """{name: instance} from kvdir's /v1/internal/instances ({} when it does not answer)."""
    try:
        status, _, body = http("GET", url + "/v1/internal/instances", timeout=5)
    except OSError:
        return {}
    if status != 200 or not isinstance(body, dict):
        return {}
    return {i.get("name"): i for i in body.get("instances") or []}


def gauges(url):
    """{instance: value} of kvdir_engine_parity_mismatch in kvdir's /metrics."""
    try:
        status, _, text = http("GET", url + "/metrics", timeout=5)
    except OSError:
        return {}
    out = {}
    if status != 200 or not isinstance(text, str):
        return out
    prefix = GAUGE + '{instance="'
    for line in text.splitlines():
        if line.startswith(prefix):
            name, _, value = line[len(prefix):].partition('"}')
            try:
                out[name] = float(value.strip())
            except ValueError:
                pass
    return out


def wait_parity(url, names, deadline_s):
    """Polls until every named engine has `engine.parity` (and a gauge) or the deadline;
    returns ({name: parity or None}, {name: gauge or None})."""
    deadline = time.time() + deadline_s
    while True:
        listed = instances(url)
        found = {n: ((listed.get(n) or {}).get("engine") or {}).get("parity") for n in names}
        seen = gauges(url)
        gauge = {n: seen.get(n) for n in names}
        if all(found.values()) and all(g is not None for g in gauge.values()):
            return found, gauge
        if time.time() > deadline:
            return found, gauge
        time.sleep(0.2)


def describe(p):
    """One line of a parity report."""
    if not p:
        return "no engine.parity reported"
    t = p.get("tokens") or {}
    if t.get("result") == "match":
        tokens = f"tokens match ({t.get('tokens')} ids)"
    elif t.get("result") == "differ":
        tokens = (f"tokens differ at position {t.get('position')} (kvdir id {t.get('kvdir')} of "
                  f"{t.get('kvdir_tokens')}, engine id {t.get('engine')} of "
                  f"{t.get('engine_tokens')})")
    else:
        tokens = f"tokens {t.get('result')} ({t.get('reason')})"
    b, m = p.get("block_size") or {}, p.get("model") or {}
    return (f"{tokens}; block size {b.get('configured')} vs engine {b.get('engine')} "
            f"ok {b.get('ok')}; model {m.get('configured')!r} among {m.get('engine')!r} "
            f"ok {m.get('ok')}")


def check_agree(results, url, names, deadline_s=30.0):
    """Each engine agrees with kvdir: tokens match, block size and model ok, the gauge 0."""
    parity, gauge = wait_parity(url, names, deadline_s)
    for name in names:
        p = parity[name] or {}
        ok = ((p.get("tokens") or {}).get("result") == "match"
              and (p.get("block_size") or {}).get("ok") is True
              and (p.get("model") or {}).get("ok") is True and gauge[name] == 0)
        results.check(ok, f"{name} parity: tokenizer, block size and model agree with kvdir",
                      f"{describe(parity[name])}; {GAUGE} {gauge[name]}")
    return parity


def warn_lines(log, name, position):
    """kvdir's WARN lines about the engine that name the position."""
    try:
        with open(log, errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    return [line for line in lines if "WARN" in line and f"engine={name}" in line
            and f"position {position} " in line]


def check_wrong_template(results, launcher, url, log, names, deadline_s=60.0):
    """Starts a second kvdir with a deliberately wrong chat template (`launcher` execs it, so
    the launcher's pid is kvdir's), checks that it reports every engine's tokens as differing,
    WARNs with the first differing position and sets the gauge to 1, then stops it."""
    print(f"     parity: a second kvdir with a wrong chat template on {url}", flush=True)
    proc = subprocess.Popen(["bash", launcher])
    try:
        deadline = time.time() + deadline_s
        up = False
        while time.time() < deadline and proc.poll() is None:
            try:
                if http("GET", url + "/health", timeout=2)[0] == 200:
                    up = True
                    break
            except OSError:
                pass
            time.sleep(0.1)
        results.check(up, "wrong-template kvdir answers /health",
                      "" if up else f"exit code {proc.poll()}; see {log}")
        if not up:
            return
        parity, gauge = wait_parity(url, names, max(5.0, deadline - time.time()))
        for name in names:
            p = parity[name] or {}
            tokens = p.get("tokens") or {}
            results.check(tokens.get("result") == "differ",
                          f"{name} wrong template: parity tokens differ", describe(parity[name]))
            position = tokens.get("position")
            lines = []
            wait_log = time.time() + 5  # the WARN is logged as the report is stored
            while position is not None:
                lines = warn_lines(log, name, position)
                if lines or time.time() > wait_log:
                    break
                time.sleep(0.1)
            results.check(bool(lines), f"{name} wrong template: a WARN names position "
                          f"{position}", lines[0].split("  ", 1)[-1][:260] if lines
                          else f"no WARN line with engine={name} and 'position {position}' "
                          f"in {log}")
            results.check(gauge[name] == 1, f"{name} wrong template: {GAUGE} is 1",
                          f"{GAUGE} {gauge[name]}")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        print("     parity: the wrong-template kvdir stopped", flush=True)
