"""Configuration: the topology schema and validator, calibration files, the RTT matrix,
and the factories that build cores from them (``factory``). Sans-IO."""
