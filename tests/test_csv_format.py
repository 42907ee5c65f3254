"""Schedules as files in torch.distributed.pipelining's CSV action format (no MPI): every hpcpar
schedule round-trips, torch's own ZB-V and DualPipeV files read as hpcpar's zb-v and dualpipev
(same order, same pairs), and what the reader cannot take is refused with the rank and cell."""
import csv
import io

import pytest

from hpcpar.pipeline import csv_format
from hpcpar.pipeline.schedules import KINDS, SCHEDULES, build, v_stage, virtual_stage


@pytest.mark.parametrize("name", SCHEDULES)
def test_every_schedule_round_trips(name):
    kind = KINDS[name]
    v = 2 if kind.chunked else 1
    for p in (1, 2, 3, 4):
        for m in range(max(kind.fewest_microbatches(p), 1), 2 * p + 2):
            s = build(name, p, m, v)
            back = csv_format.loads(csv_format.dumps(s))
            assert (back.stages, back.microbatches, back.chunks) == (p, m, v)
            assert back.split_backward == s.split_backward
            assert back.actions == s.actions
            assert [[a.overlap for a in acts] for acts in back.actions] == \
                   [[a.overlap for a in acts] for acts in s.actions]
            assert all(back.stage(r, c) == s.stage(r, c) for r in range(p) for c in range(v))


def test_the_text():
    assert csv_format.dumps(build("1f1b", 2, 2)) == "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n"
    assert csv_format.dumps(build("zb-h1", 2, 1)) == "0F0,0I0,0W0\n1F0,1I0,1W0\n"
    text = csv_format.dumps(build("dualpipev", 2, 4, 2))
    assert "(0F3;3B1)OVERLAP_F_B,(3F2;0B0)OVERLAP_F_B" in text.splitlines()[0]
    assert csv_format.loads(text).placement is v_stage
    assert csv_format.loads(csv_format.dumps(build("interleaved", 2, 2, 2))).placement is virtual_stage


def _torch_rows(cls, p, m):
    """torch's own order, as its schedule computes it for each rank (no process group needed)."""
    s = cls.__new__(cls)
    s.pp_group_size, s._n_microbatches, s.num_stages = p, m, 2 * p
    return [s._calculate_single_rank_operations(r) for r in range(p)]


@pytest.mark.parametrize("cls, name", [("ScheduleZBVZeroBubble", "zb-v"), ("ScheduleDualPipeV", "dualpipev")])
def test_torch_files_read_as_hpcpar_schedules(cls, name):
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    for p, m in [(2, 4), (2, 5), (3, 6), (4, 8), (4, 9)]:
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        for row in _torch_rows(getattr(schedules, cls), p, m):
            writer.writerow(row)                       # as its _dump_csv: None -> an empty cell
        s = csv_format.loads(out.getvalue())
        ref = build(name, p, m, 2)
        assert s.actions == ref.actions, (p, m)
        assert [a.overlap for a in s.actions[0]] == [a.overlap for a in ref.actions[0]]
        again = csv_format.loads(csv_format.dumps(s))
        assert again.actions == s.actions
        if name == "zb-v":                             # the same text, but for torch's idle cells
            cells = lambda text: [[c for c in row if c] for row in csv.reader(io.StringIO(text))]
            assert cells(csv_format.dumps(s)) == cells(out.getvalue())


@pytest.mark.parametrize("text, msg", [
    ("0F0,0X0\n", r"rank 0: cannot read the action '0X0'"),
    ("0F0,1F0\n1B0\n", "stage 1 appears on rank 0 and on rank 1"),
    ("0F0,2F0\n1F0\n", "every rank must hold the same number of stages"),
    ("0F0\n2F0\n", r"the stages must be 0..1, got \[0, 2\]"),
    ("(0F0;1F0)OVERLAP_F_B\n", "pairs F with F"),
])
def test_what_it_cannot_read_is_refused(text, msg):
    with pytest.raises(ValueError, match=msg):
        csv_format.loads(text)
