"""Write a guest's probe plan with the agent's own code: "PATH OFFSET COOKIE RETURN" lines.

python plan.py HOST_BINARY GUEST_PATH > plan
"""

import sys

from memtrace.core.abi import Layer
from memtrace.sensors.cuda import probe_plan

host, guest = sys.argv[1], sys.argv[2]
for layer in (Layer.RUNTIME, Layer.DRIVER):
    for p in probe_plan(host, layer):
        print(guest, p.offset, p.cookie, int(p.needs_return))
