"""A kubelet-like gRPC client (grpcio, the C core) for tests/dra_registration.rs.

Stubs are generated at run time from proto/ with grpcio-tools. Every channel sets
grpc.default_authority to the socket path, which is what the kubelet's grpc-go client
sends when it dials a unix socket without an authority.

Usage: dra_kubelet_client.py PROTO_DIR [--reg SOCK] --dra SOCK --expect ok|rejected
Prints one JSON line per call; exits 0 iff every call met the expectation.
"""

import argparse
import json
import os
import sys
import tempfile

import grpc
from grpc_tools import protoc

PROTOS = ["pluginregistration/v1/api.proto", "dra/v1/api.proto", "dra/v1beta1/api.proto"]


def generate(proto_dir, out):
    args = ["protoc", f"-I{proto_dir}", f"--python_out={out}", f"--grpc_python_out={out}"]
    if protoc.main(args + PROTOS) != 0:
        sys.exit("protoc failed")
    sys.path.insert(0, out)


def channel(sock):
    return grpc.insecure_channel("unix:" + sock, options=[("grpc.default_authority", sock)])


def call(name, fn):
    try:
        return {"call": name, "ok": True, "result": fn()}
    except grpc.RpcError as e:
        return {"call": name, "ok": False, "code": str(e.code()), "details": e.details()}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("proto_dir")
    p.add_argument("--reg")
    p.add_argument("--dra", required=True)
    p.add_argument("--expect", choices=["ok", "rejected"], required=True)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as out:
        generate(a.proto_dir, out)
        from pluginregistration.v1 import api_pb2 as reg_pb, api_pb2_grpc as reg_grpc
        from dra.v1 import api_pb2 as v1_pb, api_pb2_grpc as v1_grpc
        from dra.v1beta1 import api_pb2 as b1_pb, api_pb2_grpc as b1_grpc

        results = []
        if a.reg:
            reg = reg_grpc.RegistrationStub(channel(a.reg))

            def get_info():
                info = reg.GetInfo(reg_pb.InfoRequest(), timeout=5)
                return {"type": info.type, "name": info.name, "endpoint": info.endpoint,
                        "supported_versions": list(info.supported_versions)}

            results.append(call("GetInfo", get_info))

        claims = [("ns", "uid-1", "claim-1"), ("ns", "uid-2", "claim-2")]
        for version, pb, stubs in [("v1", v1_pb, v1_grpc), ("v1beta1", b1_pb, b1_grpc)]:
            stub = stubs.DRAPluginStub(channel(a.dra))
            req = pb.NodePrepareResourcesRequest(
                claims=[pb.Claim(namespace=n, uid=u, name=c) for n, u, c in claims])

            def prepare(stub=stub, req=req):
                resp = stub.NodePrepareResources(req, timeout=5)
                return {uid: r.error for uid, r in sorted(resp.claims.items())}

            # Twice on one channel: the second request's headers refer to grpc's HPACK
            # dynamic table, which the server-side adapter must mirror.
            for attempt in (1, 2):
                results.append(call(f"NodePrepareResources/{version}#{attempt}", prepare))

        for r in results:
            print(json.dumps(r), flush=True)
        want_ok = a.expect == "ok"
        sys.exit(0 if all(r["ok"] == want_ok for r in results) else 1)


if __name__ == "__main__":
    main()
