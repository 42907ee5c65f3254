"""Exercise 43 (docs/course/17-muon.md): predict, then measure - why blockwise is another optimizer.

A (4, 16) update U is cut by columns over tp ranks, as a column-parallel layer cuts its weight:
rank r holds U_r, 4 rows and 16 / tp columns.  In --muon-tp blockwise each rank orthogonalises its own
block; say it does so exactly, O_r = P_r Q_r^T from U_r = P_r S_r Q_r^T.  Put the blocks back side by
side: [O_0 | ... | O_tp-1], a (4, 16) matrix.  Its four singular values are all equal.  What are they
at tp 2, and at tp 4?  (The exact modes give every singular value 1.)

Check: .venv/bin/hpcpar course check 43          (the example that shows it comes with a passed check)
"""

ANSWER = None      # (the singular value at tp 2, at tp 4), e.g. (3.0, 5.0)
