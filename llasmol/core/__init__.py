"""The ground floor: errors, atomic files, Hydra glue, the Hub probe and the task table (no torch, no Lightning)."""
