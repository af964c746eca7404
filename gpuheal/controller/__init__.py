"""The controller: informers -> work queue -> policy -> executor, under leader election."""
