"""The controller: informers -> work queue -> policy -> executor, under leader election
(each hop: docs/architecture.md#the-data-path-of-one-fault)."""
