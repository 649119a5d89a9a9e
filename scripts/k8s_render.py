#!/usr/bin/env python3
"""Renders the kustomizations of deploy/kubernetes without kubectl, and checks that the example
engines of an overlay agree with the kvdir config beside them. Needs PyYAML (the venv that
scripts/k8s-validate.sh makes has it).

    k8s_render.py render DIR            the objects DIR's kustomization.yaml makes, as YAML
    k8s_render.py same A B              renderings A and B hold the same objects
    k8s_render.py engines FILE [LABEL]  in rendering FILE (LABEL in messages), each vLLM
                                        Deployment is wired as its kvdir config expects
                                        (central: connects and announces itself; discovery:
                                        selected, annotated, binds its ports)

The renderer knows only what deploy/kubernetes uses (resources, configMapGenerator without name
suffixes, namespace) and refuses anything else, so it can never silently differ from kustomize;
where kubectl exists, k8s-validate.sh compares the two renderings with `same`.
"""

import json
import re
import sys
from pathlib import Path

import yaml

KEYS = {"apiVersion", "kind", "resources", "configMapGenerator", "generatorOptions", "namespace"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}


class Problem(Exception):
    """A manifest that cannot be rendered or that is wired wrong."""


def render(folder):
    """The objects of the kustomization in `folder`, in the order they are declared."""
    folder = Path(folder)
    k = yaml.safe_load((folder / "kustomization.yaml").read_text())
    unknown = set(k) - KEYS
    if unknown:
        raise Problem(f"{folder}/kustomization.yaml: {sorted(unknown)} not supported here; "
                      "render it with `kubectl kustomize`, or extend scripts/k8s_render.py")
    objects = []
    for entry in k.get("resources", []):
        path = folder / entry
        if path.is_dir():
            objects += render(path)
        else:
            objects += [o for o in yaml.safe_load_all(path.read_text()) if o]
    generators = k.get("configMapGenerator", [])
    if generators and not k.get("generatorOptions", {}).get("disableNameSuffixHash"):
        raise Problem(f"{folder}: configMapGenerator needs generatorOptions."
                      "disableNameSuffixHash: true (name suffixes are not rendered here)")
    for g in generators:
        generate(folder, g, objects)
    if "namespace" in k:
        set_namespace(objects, k["namespace"])
    return objects


def generate(folder, g, objects):
    """Applies one configMapGenerator entry (create, replace or merge) to `objects`."""
    if set(g) - {"name", "behavior", "files"}:
        raise Problem(f"{folder}: configMapGenerator {g.get('name')}: only name, behavior and "
                      "files are supported here")
    data = {}
    for f in g.get("files", []):
        key, _, path = f.rpartition("=")
        data[key or Path(path).name] = (folder / path).read_text()
    same = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == g["name"]]
    behavior = g.get("behavior", "create")
    if behavior == "create" and not same:
        objects.append({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": g["name"]}, "data": data})
    elif behavior == "replace" and same:
        same[0]["data"] = data
    elif behavior == "merge" and same:
        same[0].setdefault("data", {}).update(data)
    else:
        raise Problem(f"{folder}: configMapGenerator {g['name']}: behavior {behavior} with "
                      f"{len(same)} existing ConfigMap(s) of that name")


def set_namespace(objects, namespace):
    """kustomize's `namespace`: every namespaced object, and service account subjects of role
    bindings that name the default namespace (or none)."""
    for o in objects:
        if o["kind"] not in CLUSTER_SCOPED:
            o["metadata"]["namespace"] = namespace
        if o["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            for s in o.get("subjects", []):
                if s.get("kind") == "ServiceAccount" and s.get("namespace", "default") == "default":
                    s["namespace"] = namespace


def keyed(path):
    """The objects of a rendering by (kind, namespace, name)."""
    objects = [o for o in yaml.safe_load_all(Path(path).read_text()) if o]
    return {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o
            for o in objects}


def same(a, b):
    """Raises unless renderings `a` and `b` hold the same objects, in any order."""
    left, right = keyed(a), keyed(b)
    if left.keys() != right.keys():
        raise Problem(f"{a} and {b} differ in objects: {sorted(left.keys() ^ right.keys())}")
    for key in left:
        if left[key] != right[key]:
            raise Problem(f"{a} and {b} differ in {key}:\n{json.dumps(left[key], indent=1)}\n"
                          f"{json.dumps(right[key], indent=1)}")


def port(endpoint):
    """The port of a `tcp://host:port` endpoint."""
    m = re.fullmatch(r"tcp://(.+):(\d+)", endpoint)
    if not m:
        raise Problem(f"endpoint {endpoint!r} is not tcp://host:port")
    return m.group(1), int(m.group(2))


def engines(path, label):
    """Checks every Deployment that runs vLLM against the kvdir config of the same rendering
    (`label` names it in messages)."""
    objects = keyed(path)
    config = json.loads(next(o for (kind, _, name), o in objects.items()
                             if (kind, name) == ("ConfigMap", "kvdir-config"))["data"]["config.json"])
    service = next(o for (kind, _, name), o in objects.items() if (kind, name) == ("Service", "kvdir"))
    checked = 0
    for (kind, _, name), o in objects.items():
        if kind != "Deployment" or name == "kvdir":
            continue
        pod = o["spec"]["template"]
        for c in pod["spec"]["containers"]:
            args = dict(a[2:].split("=", 1) for a in c.get("args", []) if "=" in a)
            if "kv-events-config" not in args:
                continue
            where = f"{label}: Deployment {name}, container {c['name']}"
            env = {e["name"]: e for e in c.get("env", [])}
            events = json.loads(args["kv-events-config"])
            expect(where, events.get("enable_kv_cache_events") is True and
                   events.get("publisher") == "zmq", "KV events on, publisher zmq")
            expect(where, "--enable-prefix-caching" in c["args"], "--enable-prefix-caching")
            expect(where, "PYTHONHASHSEED" in env, "PYTHONHASHSEED fixed")
            if "announce" in config.get("kv_events_bind", {}):
                central(where, config, service, args, events, env)
            elif "kubernetes" in config:
                discovery(where, config, pod, args, events)
            else:
                raise Problem(f"{where}: the kvdir config neither announces nor discovers")
            checked += 1
    expect(label, checked > 0, "at least one vLLM Deployment with --kv-events-config")
    print(f"{label}: {checked} engine container(s) wired as kvdir's config expects")


def central(where, config, service, args, events, env):
    """An engine that connects to kvdir's Service and announces itself."""
    bind = config["kv_events_bind"]
    announce = bind["announce"]
    host, p = port(events["endpoint"])
    ports = {sp["name"]: sp["port"] for sp in service["spec"]["ports"]}
    expect(where, (host, p) == (service["metadata"]["name"], ports["kv-events"]),
           f"endpoint tcp://{service['metadata']['name']}:{ports['kv-events']} (kvdir's Service)")
    expect(where, port(bind["endpoint"])[1] == p, "the port kvdir binds (kv_events_bind.endpoint)")
    expect(where, port(events["replay_endpoint"]) == ("*", announce["replay_port"]),
           f"replay_endpoint tcp://*:{announce['replay_port']} (announce.replay_port)")
    topic = f"kv@$(POD_IP):$(POD_PORT)@{args['served-model-name']}"
    expect(where, events.get("topic") == topic, f"topic {topic}")
    ip = env.get("POD_IP", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
    expect(where, ip == "status.podIP", "POD_IP from status.podIP")
    expect(where, env.get("POD_PORT", {}).get("value") == args["port"], "POD_PORT = --port")
    expect(where, int(args["block-size"]) == announce.get("block_size", 16),
           "--block-size = announce.block_size")


def discovery(where, config, pod, args, events):
    """An engine pod that kvdir selects and dials at the ports its annotations name."""
    selector = config["kubernetes"].get("selector", "llm-d.ai/inference-serving=true")
    expect(where, selects(selector, pod["metadata"].get("labels", {})),
           f"labels that kvdir's selector {selector!r} selects")
    a = pod["metadata"].get("annotations", {})
    expect(where, port(events["endpoint"]) == ("*", int(a.get("kvdir.io/events-port", 5557))),
           "endpoint tcp://*:<kvdir.io/events-port>")
    expect(where, port(events["replay_endpoint"]) == ("*", int(a.get("kvdir.io/replay-port", 5558))),
           "replay_endpoint tcp://*:<kvdir.io/replay-port>")
    expect(where, args["port"] == a.get("kvdir.io/http-port", "8000"), "--port = kvdir.io/http-port")
    expect(where, args["block-size"] == a.get("kvdir.io/block-size", "16"),
           "--block-size = kvdir.io/block-size")
    expect(where, args["served-model-name"] == a.get("kvdir.io/model", ""),
           "--served-model-name = kvdir.io/model")
    expect(where, events.get("topic", "") == a.get("kvdir.io/topic", ""), "topic = kvdir.io/topic")


def selects(selector, labels):
    """Whether an equality-based label selector (`a=b,c!=d,e,!f`) selects `labels`."""
    if "(" in selector:
        raise Problem(f"selector {selector!r}: set-based selectors are not checked here")
    for term in (t.strip() for t in selector.split(",")):
        key, op, value = re.fullmatch(r"(!?[^=!]+)(==|=|!=)?(.*)", term).groups()
        key, value = key.strip(), value.strip()
        if op in ("=", "=="):
            ok = labels.get(key) == value
        elif op == "!=":
            ok = labels.get(key) != value
        else:
            ok = (key.lstrip("!") in labels) != key.startswith("!")
        if not ok:
            return False
    return True


def expect(where, ok, what):
    if not ok:
        raise Problem(f"{where}: expected {what}")


def main(argv):
    try:
        if argv[:1] == ["render"] and len(argv) == 2:
            yaml.safe_dump_all(render(argv[1]), sys.stdout, sort_keys=False)
        elif argv[:1] == ["same"] and len(argv) == 3:
            same(argv[1], argv[2])
        elif argv[:1] == ["engines"] and len(argv) in (2, 3):
            engines(argv[1], argv[-1])
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except Problem as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except (KeyError, StopIteration, ValueError) as e:
        print(f"error: a field is missing or malformed ({type(e).__name__} {e})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
