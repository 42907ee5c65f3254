"""Reading a run's trace afterwards: the summary, the timeline plot, the bubble (report.py) and ZeRO-3's
gathers drawn (zero_plot.py).  The tracer the ranks write to while they run is hpcpar/tracer.py."""
