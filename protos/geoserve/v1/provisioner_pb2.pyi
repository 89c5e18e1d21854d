from geoserve.v1 import common_pb2 as _common_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class WatchRequest(_message.Message):
    __slots__ = ("subscriber",)
    SUBSCRIBER_FIELD_NUMBER: _ClassVar[int]
    subscriber: str
    def __init__(self, subscriber: _Optional[str] = ...) -> None: ...

class GetSnapshotRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ("since_s", "until_s")
    SINCE_S_FIELD_NUMBER: _ClassVar[int]
    UNTIL_S_FIELD_NUMBER: _ClassVar[int]
    since_s: float
    until_s: float
    def __init__(self, since_s: _Optional[float] = ..., until_s: _Optional[float] = ...) -> None: ...

class ProvisionerStats(_message.Message):
    __slots__ = ("mode", "period_s", "polls", "snapshots", "failures", "skipped", "mean_batch_ratio", "occupancy_samples")
    MODE_FIELD_NUMBER: _ClassVar[int]
    PERIOD_S_FIELD_NUMBER: _ClassVar[int]
    POLLS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    MEAN_BATCH_RATIO_FIELD_NUMBER: _ClassVar[int]
    OCCUPANCY_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    mode: str
    period_s: float
    polls: int
    snapshots: int
    failures: int
    skipped: int
    mean_batch_ratio: float
    occupancy_samples: int
    def __init__(self, mode: _Optional[str] = ..., period_s: _Optional[float] = ..., polls: _Optional[int] = ..., snapshots: _Optional[int] = ..., failures: _Optional[int] = ..., skipped: _Optional[int] = ..., mean_batch_ratio: _Optional[float] = ..., occupancy_samples: _Optional[int] = ...) -> None: ...
