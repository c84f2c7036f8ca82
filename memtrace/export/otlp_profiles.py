"""Call sites as OTLP profiles, for `memtrace push --stacks`.

The same call sites as the summary's `stacks`, pprof and the flame graph
(export/callsites.py), in OpenTelemetry's profiles signal
(opentelemetry-proto's profiles/v1development, as the pinned collector
reads it behind its `service.profilesSupport` feature gate, deploy/otelcol).

Each push sends, per traced process (one resource: its pid, start and
name beside the host's attributes), one profile per sample type:

  copies, copy_bytes          (count, bytes) since the last push that arrived
  allocations, allocated_bytes (count, bytes) since the last push that arrived
  in_use_bytes                 (bytes) still allocated now, by allocating stack

A sample is a call site: its stack (frames innermost first: the CUDA call's
caller first; Python frames with their file and the line being executed,
native ones with their module and offset) and its attributes: the api,
direction and host memory (`memtrace.api`, `memtrace.direction`,
`memtrace.host_memory`). A push that fails is sent again whole with the
next: nothing is counted twice or lost.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import ExportProfilesServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.profiles.v1development import profiles_pb2 as pb
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from memtrace.export import catalog as cat
from memtrace.export.catalog import SampleType
from memtrace.export.config import OtlpSignal, PushConfig
from memtrace.export.transport import Transport

DELTA_TYPES = {
    "copy": (cat.PROFILE_COPIES, cat.PROFILE_COPY_BYTES),
    "alloc": (cat.PROFILE_ALLOCATIONS, cat.PROFILE_ALLOCATED_BYTES),
}
IN_USE = cat.PROFILE_IN_USE
ATTRIBUTES = (
    ("api", cat.PROFILE_API.name),
    ("direction", cat.PROFILE_DIRECTION.name),
    ("host_memory", cat.PROFILE_HOST_MEMORY.name),
)


def _any(v: Any) -> AnyValue:
    if isinstance(v, bool):
        return AnyValue(bool_value=v)
    if isinstance(v, int):
        return AnyValue(int_value=v)
    if isinstance(v, float):
        return AnyValue(double_value=v)
    return AnyValue(string_value=str(v))


class _Dictionary:
    """The request's shared tables; index 0 of each is its zero value, as the format asks."""

    def __init__(self) -> None:
        self.d = pb.ProfilesDictionary()
        self.d.string_table.append("")
        self.d.mapping_table.add()
        self.d.location_table.add()
        self.d.function_table.add()
        self.d.stack_table.add()
        self.d.attribute_table.add()
        self.d.link_table.add()
        self._strings: dict[str, int] = {"": 0}
        self._index: dict[tuple[Any, ...], int] = {}

    def s(self, text: str) -> int:
        i = self._strings.get(text)
        if i is None:
            i = self._strings[text] = len(self.d.string_table)
            self.d.string_table.append(text)
        return i

    def _once(self, key: tuple[Any, ...], table: Any, make: Any) -> int:
        i = self._index.get(key)
        if i is None:
            i = self._index[key] = len(table)
            table.append(make())
        return i

    def attribute(self, key: str, value: str) -> int:
        return self._once(
            ("attr", key, value),
            self.d.attribute_table,
            lambda: pb.KeyValueAndUnit(key_strindex=self.s(key), value=AnyValue(string_value=value)),
        )

    def function(self, name: str, filename: str) -> int:
        return self._once(
            ("fn", name, filename),
            self.d.function_table,
            lambda: pb.Function(
                name_strindex=self.s(name), system_name_strindex=self.s(name), filename_strindex=self.s(filename)
            ),
        )

    def location(self, f: Mapping[str, Any]) -> int:
        if "file" in f:  # a Python frame: its function at the line being executed
            key: tuple[Any, ...] = ("py", f["function"], f["file"], f["line"] or 0)
            return self._once(
                key,
                self.d.location_table,
                lambda: pb.Location(
                    lines=[pb.Line(function_index=self.function(str(f["function"]), f["file"]), line=f["line"] or 0)]
                ),
            )
        module, offset = f["module"], int(f["offset"])
        name = f.get("function") or f"{module.rsplit('/', 1)[-1]}+{offset:#x}"
        mapping = self._once(
            ("map", module, f.get("build_id", "")),
            self.d.mapping_table,
            lambda: pb.Mapping(filename_strindex=self.s(module)),
        )
        return self._once(
            ("native", module, offset, name),
            self.d.location_table,
            lambda: pb.Location(
                mapping_index=mapping, address=offset, lines=[pb.Line(function_index=self.function(name, module))]
            ),
        )

    def stack(self, frames: list[Mapping[str, Any]]) -> int:
        locs = tuple(self.location(f) for f in frames)
        return self._once(("stack", locs), self.d.stack_table, lambda: pb.Stack(location_indices=locs))


def _site_key(site: Mapping[str, Any]) -> tuple[Any, ...]:
    return (
        site["pid"],
        site.get("start_time_unix_nano", 0),
        site["kind"],
        site["api"],
        site.get("direction"),
        site.get("host_memory"),
        json.dumps(site["frames"], sort_keys=True),
    )


@dataclass
class ProfileBatch:
    """One push's profiles, and what the builder keeps once it arrives."""

    request: ExportProfilesServiceRequest | None  # None: nothing to send
    sent: dict[tuple[Any, ...], tuple[int, int]] = field(default_factory=dict)
    now_ns: int = 0
    samples: int = 0
    base: int = 0  # the builder's commits when it was built: its deltas start there


class ProfilesBuilder:
    """Builds each push's profiles: deltas of calls and bytes per call site
    since the last push that arrived, and the bytes in use now."""

    def __init__(self, host: Mapping[str, Any], version: str = "") -> None:
        self.host = dict(host)
        self.version = version
        self._sent: dict[tuple[Any, ...], tuple[int, int]] = {}
        self._since_ns = time.time_ns()
        self.commits = 0

    def build(self, sites: list[dict[str, Any]], processes: Mapping[int, Mapping[str, Any]]) -> ProfileBatch:
        """`sites`: call sites (export/callsites.py); `processes`: each pid's
        resource (export/otlp.py resource_of, as its metrics have it)."""
        now = time.time_ns()
        d = _Dictionary()
        sent = dict(self._sent)
        per_pid: dict[int, dict[SampleType, list[pb.Sample]]] = {}
        count = 0
        for site in sites:
            key = _site_key(site)
            calls0, bytes0 = self._sent.get(key, (0, 0))
            sent[key] = (site["calls"], site["bytes"])
            values = list(zip(DELTA_TYPES[site["kind"]], (site["calls"] - calls0, site["bytes"] - bytes0), strict=True))
            if site["kind"] == "alloc":
                values.append((IN_USE, int(site.get("in_use_bytes", 0))))
            values = [(t, v) for t, v in values if v > 0]
            if not values:
                continue
            frames = site["frames"] or [{"module": "[no stack]", "offset": 0, "function": site["api"]}]
            stack = d.stack(frames)
            attrs = [d.attribute(name, str(site[k])) for k, name in ATTRIBUTES if site.get(k)]
            by_type = per_pid.setdefault(int(site["pid"]), {})
            for t, v in values:
                by_type.setdefault(t, []).append(pb.Sample(stack_index=stack, values=[v], attribute_indices=attrs))
                count += 1
        if not per_pid:
            return ProfileBatch(None, sent, now, 0, self.commits)
        resource_profiles = []
        for pid, by_type in sorted(per_pid.items()):
            resource = processes.get(pid) or {**self.host, "process.pid": pid}
            profiles = []
            for t, samples in by_type.items():
                instant = t == IN_USE
                profiles.append(
                    pb.Profile(
                        sample_type=pb.ValueType(type_strindex=d.s(t.name), unit_strindex=d.s(t.unit)),
                        samples=samples,
                        time_unix_nano=now if instant else self._since_ns,
                        duration_nano=0 if instant else now - self._since_ns,
                    )
                )
            resource_profiles.append(
                pb.ResourceProfiles(
                    resource=Resource(attributes=[KeyValue(key=k, value=_any(v)) for k, v in resource.items()]),
                    scope_profiles=[
                        pb.ScopeProfiles(
                            scope=InstrumentationScope(name="memtrace", version=self.version), profiles=profiles
                        )
                    ],
                )
            )
        req = ExportProfilesServiceRequest(resource_profiles=resource_profiles, dictionary=d.d)
        return ProfileBatch(req, sent, now, count, self.commits)

    def current(self, batch: ProfileBatch) -> bool:
        """Were its deltas taken from the last batch that arrived? (A batch
        built before another arrived overlaps it: never sent.)"""
        return batch.base == self.commits

    def commit(self, batch: ProfileBatch) -> None:
        """The batch arrived: the next push's deltas start from it."""
        self._sent = batch.sent
        self._since_ns = batch.now_ns
        self.commits += 1

    def forget(self, pids: set[int]) -> None:
        """Processes gone and sent a final time."""
        self._sent = {k: v for k, v in self._sent.items() if k[0] not in pids}


class ProfilesSender:
    """Sends each push's profiles over the transport: a POST (OTLP/HTTP) or a
    call of the profiles service (OTLP/gRPC); failures are a reason string."""

    def __init__(self, cfg: PushConfig) -> None:
        self.transport = Transport(cfg, OtlpSignal.profiles)
        self.url = self.transport.where
        self._stub: Any = None
        if not self.transport.http:
            from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2_grpc import (
                ProfilesServiceStub,
            )

            self._stub = ProfilesServiceStub(self.transport.channel())  # type: ignore[no-untyped-call]

    def send(self, req: ExportProfilesServiceRequest) -> str:
        """'' when it arrived, else why not."""
        if self._stub is None:
            return self.transport.post(req.SerializeToString())
        return self.transport.call(self._stub.Export, req)
