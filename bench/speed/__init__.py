"""Speed and memory: the latency sweep and its bound, generation throughput, peak memory, the scaling table and
new-parameter counts (`golinear latency`, `golinear generation`, `golinear params`)."""
