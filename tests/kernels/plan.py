"""Write a guest's probe plan with the agent's own code: "PATH OFFSET COOKIE RETURN" lines,
or with --nccl the NCCL sensor's: "PATH OFFSET COOKIE COMM" (COMM 1: a communicator call).

python plan.py [--nccl] HOST_BINARY GUEST_PATH > plan
"""

import sys

from memtrace.core.abi import Layer
from memtrace.sensors.cuda import probe_plan

if sys.argv[1] == "--nccl":
    from memtrace.sensors.nccl.plan import probe_plan as nccl_plan

    host, guest = sys.argv[2], sys.argv[3]
    for n in nccl_plan(host):
        print(guest, n.offset, n.cookie, int(n.comm))
    sys.exit(0)
host, guest = sys.argv[1], sys.argv[2]
for layer in (Layer.RUNTIME, Layer.DRIVER):
    for p in probe_plan(host, layer):
        print(guest, p.offset, p.cookie, int(p.needs_return))
