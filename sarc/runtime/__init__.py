"""Running compiled layers: binding inputs, graphs, (later) shards and schedules."""
