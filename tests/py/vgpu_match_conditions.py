"""Evaluates the matchConditions (CEL, cel-python) of the vGPU pod webhook entry that
daemonset/components/vgpu-scheduler/webhook-patch.yaml adds (or components/vgpu-dra's,
whose webhook creates ResourceClaimTemplates and leaves pods for Tessera's scheduler
profile alone), against pods as the API
server would send them: the pods it must select (vGPU shares in containers or init
containers, in limits or requests, queue label or not) and those it must leave alone
(whole-GPU pods, CPU pods, pods for another scheduler). Exits 1 naming each pod decided
wrongly, or a condition that does not evaluate.

    python3 tests/py/vgpu_match_conditions.py [daemonset/components/vgpu-scheduler/webhook-patch.yaml]
    python3 tests/py/vgpu_match_conditions.py daemonset/components/vgpu-dra/webhook-patch.yaml
"""

import sys

import celpy
import yaml

PATCH = sys.argv[1] if len(sys.argv) > 1 else "daemonset/components/vgpu-scheduler/webhook-patch.yaml"
DRA = "vgpu-dra" in PATCH


def container(name, limits=None, requests=None):
    c = {"name": name, "image": "cuda"}
    resources = {}
    if limits is not None:
        resources["limits"] = limits
    if requests is not None:
        resources["requests"] = requests
    if resources:
        c["resources"] = resources
    return c


def pod(containers, init=None, scheduler="default-scheduler", labels=None):
    spec = {"containers": containers}
    if init is not None:
        spec["initContainers"] = init
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    meta = {"name": "p", "namespace": "ml"}
    if labels:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


VGPU = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10240", "nvidia.com/gpucores": "30"}
# (what, pod, selected)
CASES = [
    ("the issue's pod", pod([container("main", limits=VGPU)]), True),
    ("gpumem-percentage alone", pod([container("main", limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "25"})]), True),
    ("gpucores in requests only", pod([container("main", requests={"nvidia.com/gpu": "1", "nvidia.com/gpucores": "50"})]), True),
    ("the second container", pod([container("side"), container("main", limits=VGPU)]), True),
    ("an init container", pod([container("main")], init=[container("warm", limits=VGPU)]), True),
    ("a queued vGPU pod", pod([container("main", limits=VGPU)], labels={"tessera.io/queue-name": "lq"}), True),
    ("no schedulerName field", pod([container("main", limits=VGPU)], scheduler=None), True),
    # DRA mode: a pod sent to the extender's profile by hand is that profile's.
    ("already Tessera's", pod([container("main", limits=VGPU)], scheduler="tessera-scheduler"), not DRA),
    ("an invalid request still reaches the webhook", pod([container("main", limits={"nvidia.com/gpucores": "150"})]), True),
    ("a whole-GPU pod", pod([container("main", limits={"nvidia.com/gpu": "1"})]), False),
    ("NVIDIA's shared resource", pod([container("main", limits={"nvidia.com/gpu.shared": "1"})]), False),
    ("a CPU pod", pod([container("main", limits={"cpu": "1", "memory": "1Gi"})]), False),
    ("no resources", pod([container("main")], init=[container("warm")]), False),
    ("empty resources", pod([{"name": "main", "image": "x", "resources": {}}]), False),
    ("HAMi's scheduler", pod([container("main", limits=VGPU)], scheduler="hami-scheduler"), False),
    ("another scheduler", pod([container("main", limits=VGPU)], scheduler="volcano"), False),
]


def main():
    with open(PATCH) as f:
        ops = yaml.safe_load(f)
    webhook = next(op["value"] for op in ops if op["value"].get("name") == "vgpu-pods.admission.tessera.io")
    conditions = [c["expression"] for c in webhook["matchConditions"]]
    env = celpy.Environment()
    programs = [env.program(env.compile(c)) for c in conditions]
    wrong = []
    for what, obj, selected in CASES:
        activation = celpy.json_to_cel({"object": obj, "oldObject": None,
                                        "request": {"operation": "CREATE"}})
        results = []
        for expr, program in zip(conditions, programs):
            got = program.evaluate(activation)
            if not isinstance(got, celpy.celtypes.BoolType):
                wrong.append(f"{what}: condition does not evaluate to a bool: {got!r} ({expr[:60]}...)")
                break
            results.append(bool(got))
        else:
            if all(results) != selected:
                wrong.append(f"{what}: {'selected' if all(results) else 'not selected'}, want {'selected' if selected else 'not selected'}")
    # The entry's other settings the docs argue for.
    # DRA mode creates ResourceClaimTemplates, never on a dry run.
    side_effects = "NoneOnDryRun" if DRA else "None"
    if webhook["failurePolicy"] != "Fail" or webhook["sideEffects"] != side_effects:
        wrong.append(f"failurePolicy Fail and sideEffects {side_effects} expected")
    if webhook["clientConfig"]["service"]["path"] != "/vgpu":
        wrong.append("the entry must call /vgpu")
    excluded = webhook["namespaceSelector"]["matchExpressions"][0]
    if excluded["operator"] != "NotIn" or set(excluded["values"]) != {"kube-system", "tessera-system"}:
        wrong.append("kube-system and tessera-system must be excluded")
    if "objectSelector" in webhook:
        wrong.append("no objectSelector: pods reach it with or without a queue label")
    for w in wrong:
        print(w, file=sys.stderr)
    if wrong:
        sys.exit(1)
    print(f"vGPU webhook matchConditions ({PATCH}): {len(CASES)} pods decided as intended")


if __name__ == "__main__":
    main()
