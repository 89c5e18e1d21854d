from geoserve.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SubmitRequest(_message.Message):
    __slots__ = ("request",)
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    request: _common_pb2.Request
    def __init__(self, request: _Optional[_Union[_common_pb2.Request, _Mapping]] = ...) -> None: ...

class SubmitAck(_message.Message):
    __slots__ = ("request_id", "engine", "time_s")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    TIME_S_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    engine: str
    time_s: float
    def __init__(self, request_id: _Optional[str] = ..., engine: _Optional[str] = ..., time_s: _Optional[float] = ...) -> None: ...

class GetStateRequest(_message.Message):
    __slots__ = ("include_engines",)
    INCLUDE_ENGINES_FIELD_NUMBER: _ClassVar[int]
    include_engines: bool
    def __init__(self, include_engines: _Optional[bool] = ...) -> None: ...

class EngineState(_message.Message):
    __slots__ = ("engine", "running", "waiting", "queue_tokens", "kv_tokens", "kv_occupancy_ratio", "prefill_duty_ratio", "steps")
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    QUEUE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KV_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KV_OCCUPANCY_RATIO_FIELD_NUMBER: _ClassVar[int]
    PREFILL_DUTY_RATIO_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    engine: str
    running: int
    waiting: int
    queue_tokens: float
    kv_tokens: float
    kv_occupancy_ratio: float
    prefill_duty_ratio: float
    steps: int
    def __init__(self, engine: _Optional[str] = ..., running: _Optional[int] = ..., waiting: _Optional[int] = ..., queue_tokens: _Optional[float] = ..., kv_tokens: _Optional[float] = ..., kv_occupancy_ratio: _Optional[float] = ..., prefill_duty_ratio: _Optional[float] = ..., steps: _Optional[int] = ...) -> None: ...

class DcStateReply(_message.Message):
    __slots__ = ("state", "engines")
    STATE_FIELD_NUMBER: _ClassVar[int]
    ENGINES_FIELD_NUMBER: _ClassVar[int]
    state: _common_pb2.DcState
    engines: _containers.RepeatedCompositeFieldContainer[EngineState]
    def __init__(self, state: _Optional[_Union[_common_pb2.DcState, _Mapping]] = ..., engines: _Optional[_Iterable[_Union[EngineState, _Mapping]]] = ...) -> None: ...

class SetFrequencyRequest(_message.Message):
    __slots__ = ("gpu_frequency_mhz",)
    GPU_FREQUENCY_MHZ_FIELD_NUMBER: _ClassVar[int]
    gpu_frequency_mhz: float
    def __init__(self, gpu_frequency_mhz: _Optional[float] = ...) -> None: ...

class SetFrequencyReply(_message.Message):
    __slots__ = ("gpu_frequency_mhz", "prefill_time_factor", "decode_time_factor")
    GPU_FREQUENCY_MHZ_FIELD_NUMBER: _ClassVar[int]
    PREFILL_TIME_FACTOR_FIELD_NUMBER: _ClassVar[int]
    DECODE_TIME_FACTOR_FIELD_NUMBER: _ClassVar[int]
    gpu_frequency_mhz: float
    prefill_time_factor: float
    decode_time_factor: float
    def __init__(self, gpu_frequency_mhz: _Optional[float] = ..., prefill_time_factor: _Optional[float] = ..., decode_time_factor: _Optional[float] = ...) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ("grace_s",)
    GRACE_S_FIELD_NUMBER: _ClassVar[int]
    grace_s: float
    def __init__(self, grace_s: _Optional[float] = ...) -> None: ...

class DrainReply(_message.Message):
    __slots__ = ("completed", "failed")
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    completed: int
    failed: int
    def __init__(self, completed: _Optional[int] = ..., failed: _Optional[int] = ...) -> None: ...

class CarmSlotPlan(_message.Message):
    __slots__ = ("slot_start_s", "slot_length_s", "gpu_frequency_mhz", "training_power_w", "renewable_supply_w")
    SLOT_START_S_FIELD_NUMBER: _ClassVar[int]
    SLOT_LENGTH_S_FIELD_NUMBER: _ClassVar[int]
    GPU_FREQUENCY_MHZ_FIELD_NUMBER: _ClassVar[int]
    TRAINING_POWER_W_FIELD_NUMBER: _ClassVar[int]
    RENEWABLE_SUPPLY_W_FIELD_NUMBER: _ClassVar[int]
    slot_start_s: float
    slot_length_s: float
    gpu_frequency_mhz: float
    training_power_w: float
    renewable_supply_w: float
    def __init__(self, slot_start_s: _Optional[float] = ..., slot_length_s: _Optional[float] = ..., gpu_frequency_mhz: _Optional[float] = ..., training_power_w: _Optional[float] = ..., renewable_supply_w: _Optional[float] = ...) -> None: ...

class CarmSlotAck(_message.Message):
    __slots__ = ("gpu_frequency_mhz",)
    GPU_FREQUENCY_MHZ_FIELD_NUMBER: _ClassVar[int]
    gpu_frequency_mhz: float
    def __init__(self, gpu_frequency_mhz: _Optional[float] = ...) -> None: ...
