from geoserve.v1 import common_pb2 as _common_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class SchedulerInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SchedulerInfo(_message.Message):
    __slots__ = ("region", "policy", "snapshot_age_s", "decisions", "forwarded", "fallbacks")
    REGION_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_AGE_S_FIELD_NUMBER: _ClassVar[int]
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    FORWARDED_FIELD_NUMBER: _ClassVar[int]
    FALLBACKS_FIELD_NUMBER: _ClassVar[int]
    region: str
    policy: str
    snapshot_age_s: float
    decisions: int
    forwarded: int
    fallbacks: int
    def __init__(self, region: _Optional[str] = ..., policy: _Optional[str] = ..., snapshot_age_s: _Optional[float] = ..., decisions: _Optional[int] = ..., forwarded: _Optional[int] = ..., fallbacks: _Optional[int] = ...) -> None: ...
