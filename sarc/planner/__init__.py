"""The planner: cost formulas over the IR, partition statistics, and the Plan."""
