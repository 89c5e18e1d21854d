"""Runtime helpers of the wall clock and of both runtimes: the clock interface and its two
clocks, gRPC helpers and stream links, the health probe, Prometheus metrics. The only
shared folder allowed to do I/O."""
