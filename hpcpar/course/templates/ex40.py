"""Exercise 40 (docs/course/15-v-pipelines.md): the ends of a pipeline with multi-token prediction.

DeepSeek-V3's MTP modules (`--mtp D`) predict tokens further ahead from the model's last hidden state,
through the model's own token embedding and output head.  The model is deepseek-tiny (an untied head);
its parameters at the ends of the model are named

    embed_tokens.weight    the token embedding          lm_head.weight     the output head
    norm.weight            the final norm               layers.N.*         MTP module k (N = layers + k - 1)

A pipeline of `pp` ranks runs the schedule `schedule` with `chunks` model chunks a rank: the model is cut
into pp x chunks consecutive virtual stages.  1f1b: rank r holds stage r; interleaved: chunk c of rank r is
stage c pp + r; zb-v and dualpipev: rank r holds stage r as its chunk 0 and stage 2 pp - 1 - r as its
chunk 1 (a V).  `mtp` is the number of MTP modules (0: none).

Return (at, summed, counted):

    at        (rank, chunk) that holds the MTP modules, or None without them
    summed    {parameter name: the pp ranks over which its gradient is summed every step}, for each
              gradient summed between pipeline ranks ({} if none)
    counted   the pp ranks whose copy of embed_tokens.weight the gradient norm counts (a tuple)

Check: .venv/bin/hpcpar course check 40
"""


def pipeline_ends(pp, schedule, chunks, mtp):
    """-> (at, summed, counted)"""
    raise NotImplementedError
