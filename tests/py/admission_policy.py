"""Evaluates the CEL of daemonset/controller/admission-policy.yaml (cel-python, standard
CEL) against the requests the controller makes and the ones it must never make, as the
API server would see them. Exits 1 naming each request decided wrongly.

    python3 tests/py/admission_policy.py [daemonset/controller/admission-policy.yaml]
"""

import sys

import celpy
import yaml

POLICY = sys.argv[1] if len(sys.argv) > 1 else "daemonset/controller/admission-policy.yaml"
SA = "system:serviceaccount:tessera-system:tessera-controller"


def request(op, resource, namespace, sub="", obj=None, old=None, user=SA):
    return {
        "request": {
            "operation": op,
            "resource": {"group": "", "version": "v1", "resource": resource},
            "subResource": sub,
            "namespace": namespace,
            "userInfo": {"username": user},
        },
        "object": obj,
        "oldObject": old,
    }


def pod(labels):
    meta = {"name": "p", "namespace": "team"}
    if labels is not None:
        meta["labels"] = labels
    return {"metadata": meta}


QUEUED = {"tessera.io/queue-name": "q"}
# (what, request, allowed)
CASES = [
    ("ungate a queued pod", request("UPDATE", "pods", "team", obj=pod(QUEUED), old=pod(QUEUED)), True),
    ("delete a gated pod of a group", request("DELETE", "pods", "team", old=pod(QUEUED)), True),
    ("delete a pod with Kueue's label", request("DELETE", "pods", "team", old=pod({"kueue.x-k8s.io/queue-name": "q"})), True),
    ("evict a pod", request("CREATE", "pods", "team", sub="eviction", obj={"metadata": {"name": "p"}}), True),
    ("delete a pod without a queue label", request("DELETE", "pods", "team", old=pod({"app": "web"})), False),
    ("delete a pod without labels", request("DELETE", "pods", "team", old=pod(None)), False),
    ("update a pod without a queue label", request("UPDATE", "pods", "team", obj=pod({"app": "web"}), old=pod({"app": "web"})), False),
    ("delete a pod in kube-system", request("DELETE", "pods", "kube-system", old=pod(QUEUED)), False),
    ("evict a pod in kube-system", request("CREATE", "pods", "kube-system", sub="eviction", obj={"metadata": {"name": "p"}}), False),
    ("evict a pod in tessera-system", request("CREATE", "pods", "tessera-system", sub="eviction", obj={"metadata": {"name": "p"}}), False),
]


def main():
    with open(POLICY) as f:
        policy = next(d for d in yaml.safe_load_all(f) if d["kind"] == "ValidatingAdmissionPolicy")
    spec = policy["spec"]
    env = celpy.Environment()

    def evaluate(expr, activation):
        return env.program(env.compile(expr)).evaluate(celpy.json_to_cel(activation))

    conditions = [c["expression"] for c in spec["matchConditions"]]
    validations = [v["expression"] for v in spec["validations"]]
    wrong = []
    for what, activation, allowed in CASES:
        if not all(evaluate(c, activation) for c in conditions):
            wrong.append(f"{what}: the policy does not apply to the controller")
            continue
        got = all(bool(evaluate(v, activation)) for v in validations)
        if got != allowed:
            wrong.append(f"{what}: {'allowed' if got else 'denied'}, want {'allowed' if allowed else 'denied'}")
    # Nobody else is subject to it.
    other = request("DELETE", "pods", "kube-system", old=pod(None), user="system:serviceaccount:kube-system:other")
    if all(evaluate(c, other) for c in conditions):
        wrong.append("the policy applies to other service accounts")
    for w in wrong:
        print(w, file=sys.stderr)
    if wrong:
        sys.exit(1)
    print(f"admission policy: {len(CASES)} requests decided as intended")


if __name__ == "__main__":
    main()
