# Reads TF_CONFIG as TensorFlow's TFConfigClusterResolver does (json.loads) and prints what
# test_framework_e2e.cpp (TensorflowEveryNodeListsTheWholeClusterAndItsOwnIndex) checks. TensorFlow
# itself is not installed (too big for CI), so this stands in for MultiWorkerMirroredStrategy's
# reading of it: the schema, this node's own entry, and that this node can listen on that entry's
# address and port — what the TF server of task `index` does first.
import json
import os
import socket

raw = os.environ["TF_CONFIG"]
cfg = json.loads(raw)
print("TF_CONFIG=" + raw, flush=True)
print("HEAD_ADDR=" + os.environ["SKYFORGE_HEAD_ADDR"], flush=True)
print("tf_keys=%s|%s|%s" % (",".join(sorted(cfg)), ",".join(sorted(cfg["cluster"])), ",".join(sorted(cfg["task"]))),
      flush=True)
task = cfg["task"]
print("tf_task=%s %s %s" % (task["type"], task["index"], type(task["index"]).__name__), flush=True)
workers = cfg["cluster"]["worker"]
print("tf_types=%s %s" % (type(workers).__name__, ",".join(sorted({type(w).__name__ for w in workers}))), flush=True)
print("tf_workers=" + json.dumps(workers), flush=True)
hosts = []
for w in workers:
    host, port = w.rsplit(":", 1)
    hosts.append(host.strip("[]"))
print("tf_hosts=" + ",".join(hosts), flush=True)
own = workers[task["index"]]
host, port = own.rsplit(":", 1)
host = host.strip("[]")
family = socket.AF_INET6 if ":" in host else socket.AF_INET
with socket.socket(family, socket.SOCK_STREAM) as s:
    s.bind((host, int(port)))  # fails unless the address is this node's and the port is free
    s.listen()
    print("tf_own=%s listening" % own, flush=True)
