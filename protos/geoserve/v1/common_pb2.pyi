from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TerminalState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TERMINAL_STATE_UNSPECIFIED: _ClassVar[TerminalState]
    COMPLETED: _ClassVar[TerminalState]
    REJECTED: _ClassVar[TerminalState]
    FAILED: _ClassVar[TerminalState]

class EventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EVENT_KIND_UNSPECIFIED: _ClassVar[EventKind]
    ACCEPTED: _ClassVar[EventKind]
    FIRST_TOKEN: _ClassVar[EventKind]
    FINISHED: _ClassVar[EventKind]
TERMINAL_STATE_UNSPECIFIED: TerminalState
COMPLETED: TerminalState
REJECTED: TerminalState
FAILED: TerminalState
EVENT_KIND_UNSPECIFIED: EventKind
ACCEPTED: EventKind
FIRST_TOKEN: EventKind
FINISHED: EventKind

class Slo(_message.Message):
    __slots__ = ("ttft_s", "tpot_s")
    TTFT_S_FIELD_NUMBER: _ClassVar[int]
    TPOT_S_FIELD_NUMBER: _ClassVar[int]
    ttft_s: float
    tpot_s: float
    def __init__(self, ttft_s: _Optional[float] = ..., tpot_s: _Optional[float] = ...) -> None: ...

class Timestamps(_message.Message):
    __slots__ = ("emitted_s", "scheduler_arrival_s", "decided_s", "forwarded_arrival_s", "dc_arrival_s", "admitted_s", "first_token_s", "completed_s", "first_token_origin_s", "completed_origin_s")
    EMITTED_S_FIELD_NUMBER: _ClassVar[int]
    SCHEDULER_ARRIVAL_S_FIELD_NUMBER: _ClassVar[int]
    DECIDED_S_FIELD_NUMBER: _ClassVar[int]
    FORWARDED_ARRIVAL_S_FIELD_NUMBER: _ClassVar[int]
    DC_ARRIVAL_S_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_S_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_S_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_S_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_ORIGIN_S_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_ORIGIN_S_FIELD_NUMBER: _ClassVar[int]
    emitted_s: float
    scheduler_arrival_s: float
    decided_s: float
    forwarded_arrival_s: float
    dc_arrival_s: float
    admitted_s: float
    first_token_s: float
    completed_s: float
    first_token_origin_s: float
    completed_origin_s: float
    def __init__(self, emitted_s: _Optional[float] = ..., scheduler_arrival_s: _Optional[float] = ..., decided_s: _Optional[float] = ..., forwarded_arrival_s: _Optional[float] = ..., dc_arrival_s: _Optional[float] = ..., admitted_s: _Optional[float] = ..., first_token_s: _Optional[float] = ..., completed_s: _Optional[float] = ..., first_token_origin_s: _Optional[float] = ..., completed_origin_s: _Optional[float] = ...) -> None: ...

class Request(_message.Message):
    __slots__ = ("id", "model", "isl_tokens", "osl_tokens", "predicted_osl_tokens", "dataset", "slo", "origin_region", "timestamps", "target_region", "target_dc", "policy", "forwarded", "fallback", "decision_s")
    ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ISL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OSL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_OSL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DATASET_FIELD_NUMBER: _ClassVar[int]
    SLO_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_REGION_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMPS_FIELD_NUMBER: _ClassVar[int]
    TARGET_REGION_FIELD_NUMBER: _ClassVar[int]
    TARGET_DC_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    FORWARDED_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_FIELD_NUMBER: _ClassVar[int]
    DECISION_S_FIELD_NUMBER: _ClassVar[int]
    id: str
    model: str
    isl_tokens: int
    osl_tokens: int
    predicted_osl_tokens: int
    dataset: str
    slo: Slo
    origin_region: str
    timestamps: Timestamps
    target_region: str
    target_dc: str
    policy: str
    forwarded: bool
    fallback: bool
    decision_s: float
    def __init__(self, id: _Optional[str] = ..., model: _Optional[str] = ..., isl_tokens: _Optional[int] = ..., osl_tokens: _Optional[int] = ..., predicted_osl_tokens: _Optional[int] = ..., dataset: _Optional[str] = ..., slo: _Optional[_Union[Slo, _Mapping]] = ..., origin_region: _Optional[str] = ..., timestamps: _Optional[_Union[Timestamps, _Mapping]] = ..., target_region: _Optional[str] = ..., target_dc: _Optional[str] = ..., policy: _Optional[str] = ..., forwarded: _Optional[bool] = ..., fallback: _Optional[bool] = ..., decision_s: _Optional[float] = ...) -> None: ...

class RequestRecord(_message.Message):
    __slots__ = ("request", "state", "reason", "status_code", "dc", "engine", "output_tokens", "prefill_tokens", "preemptions", "ttft_s", "tpot_s", "e2e_s", "queue_s", "energy_j")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    STATUS_CODE_FIELD_NUMBER: _ClassVar[int]
    DC_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    TTFT_S_FIELD_NUMBER: _ClassVar[int]
    TPOT_S_FIELD_NUMBER: _ClassVar[int]
    E2E_S_FIELD_NUMBER: _ClassVar[int]
    QUEUE_S_FIELD_NUMBER: _ClassVar[int]
    ENERGY_J_FIELD_NUMBER: _ClassVar[int]
    request: Request
    state: TerminalState
    reason: str
    status_code: str
    dc: str
    engine: str
    output_tokens: int
    prefill_tokens: int
    preemptions: int
    ttft_s: float
    tpot_s: float
    e2e_s: float
    queue_s: float
    energy_j: float
    def __init__(self, request: _Optional[_Union[Request, _Mapping]] = ..., state: _Optional[_Union[TerminalState, str]] = ..., reason: _Optional[str] = ..., status_code: _Optional[str] = ..., dc: _Optional[str] = ..., engine: _Optional[str] = ..., output_tokens: _Optional[int] = ..., prefill_tokens: _Optional[int] = ..., preemptions: _Optional[int] = ..., ttft_s: _Optional[float] = ..., tpot_s: _Optional[float] = ..., e2e_s: _Optional[float] = ..., queue_s: _Optional[float] = ..., energy_j: _Optional[float] = ...) -> None: ...

class RequestEvent(_message.Message):
    __slots__ = ("kind", "request_id", "time_s", "record", "dc")
    KIND_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TIME_S_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    DC_FIELD_NUMBER: _ClassVar[int]
    kind: EventKind
    request_id: str
    time_s: float
    record: RequestRecord
    dc: str
    def __init__(self, kind: _Optional[_Union[EventKind, str]] = ..., request_id: _Optional[str] = ..., time_s: _Optional[float] = ..., record: _Optional[_Union[RequestRecord, _Mapping]] = ..., dc: _Optional[str] = ...) -> None: ...

class DcState(_message.Message):
    __slots__ = ("dc", "region", "zone", "time_s", "up", "engines", "active_batch", "queue_tokens", "kv_occupancy_ratio", "kv_tokens", "prefill_duty_ratio", "waiting_requests", "max_batch", "grid_ci_g_per_kwh", "effective_ci_g_per_kwh", "pue", "gpu_frequency_mhz", "lateness_s_p50", "lateness_s_p99", "lateness_s_max", "faithful", "power_w", "energy", "carbon_g", "completed", "rejected", "failed", "in_flight", "model", "gpu", "tp", "renewable_w", "training_w")
    DC_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    TIME_S_FIELD_NUMBER: _ClassVar[int]
    UP_FIELD_NUMBER: _ClassVar[int]
    ENGINES_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_BATCH_FIELD_NUMBER: _ClassVar[int]
    QUEUE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KV_OCCUPANCY_RATIO_FIELD_NUMBER: _ClassVar[int]
    KV_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_DUTY_RATIO_FIELD_NUMBER: _ClassVar[int]
    WAITING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_FIELD_NUMBER: _ClassVar[int]
    GRID_CI_G_PER_KWH_FIELD_NUMBER: _ClassVar[int]
    EFFECTIVE_CI_G_PER_KWH_FIELD_NUMBER: _ClassVar[int]
    PUE_FIELD_NUMBER: _ClassVar[int]
    GPU_FREQUENCY_MHZ_FIELD_NUMBER: _ClassVar[int]
    LATENESS_S_P50_FIELD_NUMBER: _ClassVar[int]
    LATENESS_S_P99_FIELD_NUMBER: _ClassVar[int]
    LATENESS_S_MAX_FIELD_NUMBER: _ClassVar[int]
    FAITHFUL_FIELD_NUMBER: _ClassVar[int]
    POWER_W_FIELD_NUMBER: _ClassVar[int]
    ENERGY_FIELD_NUMBER: _ClassVar[int]
    CARBON_G_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    TP_FIELD_NUMBER: _ClassVar[int]
    RENEWABLE_W_FIELD_NUMBER: _ClassVar[int]
    TRAINING_W_FIELD_NUMBER: _ClassVar[int]
    dc: str
    region: str
    zone: str
    time_s: float
    up: bool
    engines: int
    active_batch: float
    queue_tokens: float
    kv_occupancy_ratio: float
    kv_tokens: float
    prefill_duty_ratio: float
    waiting_requests: float
    max_batch: int
    grid_ci_g_per_kwh: float
    effective_ci_g_per_kwh: float
    pue: float
    gpu_frequency_mhz: float
    lateness_s_p50: float
    lateness_s_p99: float
    lateness_s_max: float
    faithful: bool
    power_w: float
    energy: EnergyBreakdown
    carbon_g: float
    completed: int
    rejected: int
    failed: int
    in_flight: int
    model: str
    gpu: str
    tp: int
    renewable_w: float
    training_w: float
    def __init__(self, dc: _Optional[str] = ..., region: _Optional[str] = ..., zone: _Optional[str] = ..., time_s: _Optional[float] = ..., up: _Optional[bool] = ..., engines: _Optional[int] = ..., active_batch: _Optional[float] = ..., queue_tokens: _Optional[float] = ..., kv_occupancy_ratio: _Optional[float] = ..., kv_tokens: _Optional[float] = ..., prefill_duty_ratio: _Optional[float] = ..., waiting_requests: _Optional[float] = ..., max_batch: _Optional[int] = ..., grid_ci_g_per_kwh: _Optional[float] = ..., effective_ci_g_per_kwh: _Optional[float] = ..., pue: _Optional[float] = ..., gpu_frequency_mhz: _Optional[float] = ..., lateness_s_p50: _Optional[float] = ..., lateness_s_p99: _Optional[float] = ..., lateness_s_max: _Optional[float] = ..., faithful: _Optional[bool] = ..., power_w: _Optional[float] = ..., energy: _Optional[_Union[EnergyBreakdown, _Mapping]] = ..., carbon_g: _Optional[float] = ..., completed: _Optional[int] = ..., rejected: _Optional[int] = ..., failed: _Optional[int] = ..., in_flight: _Optional[int] = ..., model: _Optional[str] = ..., gpu: _Optional[str] = ..., tp: _Optional[int] = ..., renewable_w: _Optional[float] = ..., training_w: _Optional[float] = ...) -> None: ...

class EnergyBreakdown(_message.Message):
    __slots__ = ("gpu_active_j", "gpu_idle_j", "host_j", "training_j", "it_total_j", "facility_j", "renewable_j", "grid_j")
    GPU_ACTIVE_J_FIELD_NUMBER: _ClassVar[int]
    GPU_IDLE_J_FIELD_NUMBER: _ClassVar[int]
    HOST_J_FIELD_NUMBER: _ClassVar[int]
    TRAINING_J_FIELD_NUMBER: _ClassVar[int]
    IT_TOTAL_J_FIELD_NUMBER: _ClassVar[int]
    FACILITY_J_FIELD_NUMBER: _ClassVar[int]
    RENEWABLE_J_FIELD_NUMBER: _ClassVar[int]
    GRID_J_FIELD_NUMBER: _ClassVar[int]
    gpu_active_j: float
    gpu_idle_j: float
    host_j: float
    training_j: float
    it_total_j: float
    facility_j: float
    renewable_j: float
    grid_j: float
    def __init__(self, gpu_active_j: _Optional[float] = ..., gpu_idle_j: _Optional[float] = ..., host_j: _Optional[float] = ..., training_j: _Optional[float] = ..., it_total_j: _Optional[float] = ..., facility_j: _Optional[float] = ..., renewable_j: _Optional[float] = ..., grid_j: _Optional[float] = ...) -> None: ...

class RttEntry(_message.Message):
    __slots__ = ("from_region", "to_region", "rtt_s")
    FROM_REGION_FIELD_NUMBER: _ClassVar[int]
    TO_REGION_FIELD_NUMBER: _ClassVar[int]
    RTT_S_FIELD_NUMBER: _ClassVar[int]
    from_region: str
    to_region: str
    rtt_s: float
    def __init__(self, from_region: _Optional[str] = ..., to_region: _Optional[str] = ..., rtt_s: _Optional[float] = ...) -> None: ...

class Snapshot(_message.Message):
    __slots__ = ("seq", "time_s", "dcs", "rtt", "poll_period_s")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TIME_S_FIELD_NUMBER: _ClassVar[int]
    DCS_FIELD_NUMBER: _ClassVar[int]
    RTT_FIELD_NUMBER: _ClassVar[int]
    POLL_PERIOD_S_FIELD_NUMBER: _ClassVar[int]
    seq: int
    time_s: float
    dcs: _containers.RepeatedCompositeFieldContainer[DcState]
    rtt: _containers.RepeatedCompositeFieldContainer[RttEntry]
    poll_period_s: float
    def __init__(self, seq: _Optional[int] = ..., time_s: _Optional[float] = ..., dcs: _Optional[_Iterable[_Union[DcState, _Mapping]]] = ..., rtt: _Optional[_Iterable[_Union[RttEntry, _Mapping]]] = ..., poll_period_s: _Optional[float] = ...) -> None: ...
