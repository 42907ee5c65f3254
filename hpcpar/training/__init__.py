"""Training on the grid: the configuration, one step, the loop and its observers, the
end-of-run summary, the step profile, the start-up self-check, text in and sampled
text out."""
