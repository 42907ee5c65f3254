"""Predicting a run of hpcpar's own engine on this machine, from a calibrated profile.

``hpcpar plan calibrate`` writes a profile of this machine (one numpy rank per core); with it the same
step model that plans 1024 GPUs predicts ``hpcpar train`` on 1 or 2 ranks.  The engine's presets
(hpcpar/nn/gpt.py, with the synthetic language's 32-token vocabulary) as planner shapes:

    tiny   2 layers, d_model 64, 4 heads, sequence 64
    small  4 layers, d_model 256, 8 heads, sequence 128

A ``hpcpar train`` layout maps onto a planner layout with micro-batch size
batch_size / (dp * microbatches); hpcpar sends with Isend/Irecv posted ahead, all-reduces DP buckets
during the backward and keeps plain float32 or float64 state (16 or 32 bytes per parameter).
"""
from hpcpar.plan.hardware import load_hardware
from hpcpar.plan.job import Engine, Job
from hpcpar.plan.layout import Layout
from hpcpar.plan.models import parse_dims
from hpcpar.plan.step import estimate

LOCAL_MODELS = {"tiny": ("l=2,h=64,a=4,V=32,name=tiny", 64), "small": ("l=4,h=256,a=8,V=32,name=small", 128)}
DTYPES = {"float32": "fp32", "float64": "fp64"}


def predict_local(profile, model="tiny", tp=1, pp=1, dp=1, schedule="1f1b", microbatches=1, batch_size=16,
                  dtype="float32", recompute=False, zero1=False, bucket_mb=4.0):
    """The planner's Estimate of one ``hpcpar train`` step with these flags (same names as train's)."""
    dims, seq_len = LOCAL_MODELS[model]
    hw = load_hardware(profile)
    ranks = tp * pp * dp
    job = Job(parse_dims(dims), hw, ranks, min(ranks, hw.gpus_per_node), batch_size, seq_len,
              dtype=DTYPES[dtype], engine=Engine(bucket_bytes=bucket_mb * 1e6))
    mb = batch_size // (dp * microbatches)
    layout = Layout(tp, pp, dp, mb, 2 if schedule == "interleaved" else 1, schedule,
                    "full" if recompute else "none", zero1)
    reason = job.check(layout)
    if reason:
        raise ValueError(reason)
    return estimate(job, layout)

