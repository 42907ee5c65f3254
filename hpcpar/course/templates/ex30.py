"""Exercise 30 (docs/course/03-tensor-parallel.md): your column/row-parallel layer pair, in the trainer.

Every GPT-2 block has two column-then-row pairs: c_attn then attention's c_proj, c_fc then the MLP's
c_proj.  Write the four functions that `hpcpar train --plug` puts in place of the engine's
(hpcpar/training/plug.py): the GEMMs of one rank and the f and g region crossings around them.  Every
rank holds its cut of the weights; comm is a hpcpar Communicator over the tp ranks (comm.all_reduce(x)
returns the sum of x over them).  Shapes: x and dy (B, T, features); a bias may be None.

    column_forward(x, w, b, comm)     x (B, T, in) whole on every rank, w (in, out/tp), b (out/tp,)
                                      -> y (B, T, out/tp): this rank's columns of x W + b
    column_backward(dy, x, w, comm)   dy (B, T, out/tp): its columns of dL/dy
                                      -> dx (B, T, in) whole on every rank, dw (in, out/tp), db (out/tp,)
    row_forward(x, w, b, comm)        x (B, T, in/tp): its columns of the input, w (in/tp, out), b (out,)
                                      -> y (B, T, out) whole on every rank
    row_backward(dy, x, w, comm)      dy (B, T, out) whole -> dx (B, T, in/tp), dw (in/tp, out), db (out,)

The check runs them on 2, 3 and 4 MPI ranks against the one-rank layer, counting the all-reduces, then
trains the tiny GPT at tp 2 and tp 4 with them in float64: every step's loss and gradient norm must be
one rank's.  Try it yourself:

    .venv/bin/mpiexec -n 2 .venv/bin/hpcpar train --tp 2 --dtype float64 --steps 3 --plug course-work/ex30.py

Check: .venv/bin/hpcpar course check 30            (it starts mpiexec -n 4)
"""
import numpy as np  # noqa: F401


def column_forward(x, w, b, comm):
    raise NotImplementedError


def column_backward(dy, x, w, comm):
    raise NotImplementedError


def row_forward(x, w, b, comm):
    raise NotImplementedError


def row_backward(dy, x, w, comm):
    raise NotImplementedError
