"""Exercise 23 (docs/course/14-zero.md): ZeRO-3's gather before a unit's forward, and the free after it.

Under ZeRO-3 each of the p ranks of a data-parallel group keeps only a slice of every unit's
parameters.  A unit's parameters, laid end to end, make one flat buffer, padded with zeros to a
multiple of p: p k numbers, of which rank r keeps [r k, (r + 1) k).  You write one rank's forward
through the units, in order:

  units[i].shard      (k,) this rank's slice of unit i's flat buffer, in the dtype its layer computes in
  units[i].segments   (param, a, b) for each parameter of unit i: its numbers are the flat buffer's
                      [a, b), shaped param.data.shape; param.data is what the layer reads
  layers[i](x) -> y   unit i's forward, reading its parameters' .data
  comm.size, comm.rank
  comm.iall_gather_(buf) -> request
                      a non-blocking all-gather in place: buf (p k,) holds this rank's slice at its
                      place; once request.wait() has returned, every rank's slice is in place

Before unit i's forward its parameters must be whole (wait for its gather), and unit i + 1's gather
must already be travelling (post it before unit i computes: prefetch).  After unit i's forward free
its gathered buffer: nothing may refer to it any more - neither your variables nor the parameters'
views (set each param.data = None).  Return the last unit's output.

Check: .venv/bin/hpcpar course check 23
"""


def zero3_forward(units, layers, x, comm):
    """-> the last layer's output"""
    raise NotImplementedError
