"""What watches a running job: the watchdog that notices a stalled rank, the alarm that
wakes it, the rank guard that names a dead one, and the hang diagnosis read from the
flight records (why.py)."""
