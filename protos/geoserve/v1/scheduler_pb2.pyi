from geoserve.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class SchedulerInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SchedulerInfo(_message.Message):
    __slots__ = ("region", "policy", "snapshot_age_s", "decisions", "forwarded", "fallbacks", "local", "forwarded_in", "stale_decisions", "unplaceable", "windows", "mean_window", "solver_status", "snapshots")
    class SolverStatusEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    REGION_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_AGE_S_FIELD_NUMBER: _ClassVar[int]
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    FORWARDED_FIELD_NUMBER: _ClassVar[int]
    FALLBACKS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_FIELD_NUMBER: _ClassVar[int]
    FORWARDED_IN_FIELD_NUMBER: _ClassVar[int]
    STALE_DECISIONS_FIELD_NUMBER: _ClassVar[int]
    UNPLACEABLE_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    MEAN_WINDOW_FIELD_NUMBER: _ClassVar[int]
    SOLVER_STATUS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    region: str
    policy: str
    snapshot_age_s: float
    decisions: int
    forwarded: int
    fallbacks: int
    local: int
    forwarded_in: int
    stale_decisions: int
    unplaceable: int
    windows: int
    mean_window: float
    solver_status: _containers.ScalarMap[str, int]
    snapshots: int
    def __init__(self, region: _Optional[str] = ..., policy: _Optional[str] = ..., snapshot_age_s: _Optional[float] = ..., decisions: _Optional[int] = ..., forwarded: _Optional[int] = ..., fallbacks: _Optional[int] = ..., local: _Optional[int] = ..., forwarded_in: _Optional[int] = ..., stale_decisions: _Optional[int] = ..., unplaceable: _Optional[int] = ..., windows: _Optional[int] = ..., mean_window: _Optional[float] = ..., solver_status: _Optional[_Mapping[str, int]] = ..., snapshots: _Optional[int] = ...) -> None: ...
