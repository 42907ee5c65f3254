"""Tracing a run: the tracer every rank writes spans to (tracer.py), and the reports
read from its files afterwards (report.py: summary, timeline plot, bubble)."""
