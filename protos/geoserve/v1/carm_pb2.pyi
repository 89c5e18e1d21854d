from geoserve.v1 import datacenter_pb2 as _datacenter_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CarmStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DcPlan(_message.Message):
    __slots__ = ("dc", "plan", "solver_status", "solve_s", "training_jobs_running")
    DC_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    SOLVER_STATUS_FIELD_NUMBER: _ClassVar[int]
    SOLVE_S_FIELD_NUMBER: _ClassVar[int]
    TRAINING_JOBS_RUNNING_FIELD_NUMBER: _ClassVar[int]
    dc: str
    plan: _datacenter_pb2.CarmSlotPlan
    solver_status: str
    solve_s: float
    training_jobs_running: int
    def __init__(self, dc: _Optional[str] = ..., plan: _Optional[_Union[_datacenter_pb2.CarmSlotPlan, _Mapping]] = ..., solver_status: _Optional[str] = ..., solve_s: _Optional[float] = ..., training_jobs_running: _Optional[int] = ...) -> None: ...

class CarmStatus(_message.Message):
    __slots__ = ("formulation", "slot", "plans", "training_deadlines_missed", "last_slot_latency_s")
    FORMULATION_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    PLANS_FIELD_NUMBER: _ClassVar[int]
    TRAINING_DEADLINES_MISSED_FIELD_NUMBER: _ClassVar[int]
    LAST_SLOT_LATENCY_S_FIELD_NUMBER: _ClassVar[int]
    formulation: str
    slot: int
    plans: _containers.RepeatedCompositeFieldContainer[DcPlan]
    training_deadlines_missed: int
    last_slot_latency_s: float
    def __init__(self, formulation: _Optional[str] = ..., slot: _Optional[int] = ..., plans: _Optional[_Iterable[_Union[DcPlan, _Mapping]]] = ..., training_deadlines_missed: _Optional[int] = ..., last_slot_latency_s: _Optional[float] = ...) -> None: ...
