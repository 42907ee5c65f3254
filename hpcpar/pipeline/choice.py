"""The schedule a run executes: built from ``--schedule`` or read from ``--schedule-file``, and
checked for hangs (check.py) before any rank communicates.  config.check calls it to refuse a bad
choice in one line; the trainer calls it again to get the schedule it runs."""
from hpcpar.pipeline.check import ScheduleHazard, check
from hpcpar.pipeline.schedules import build
from hpcpar.runtime import UsageError


def file_chunks(cfg):
    """The chunks per rank of ``--schedule-file`` (0 without one): the file, not --schedule, says v."""
    return _read(cfg.schedule_file).chunks if cfg.schedule_file else 0


def schedule_for(cfg, forward_only=False):
    """The checked schedule for ``cfg`` (pp, microbatches, chunks already settled), or UsageError."""
    try:
        if cfg.schedule_file:
            schedule = _read(cfg.schedule_file)
            if (schedule.stages, schedule.chunks) != (cfg.pp, cfg.chunks):
                raise UsageError(f"--schedule-file {cfg.schedule_file} is written for {schedule.stages} "
                                 f"stages x {schedule.chunks} chunks, the run has --pp {cfg.pp} x {cfg.chunks}")
        else:
            schedule = build(cfg.schedule, cfg.pp, cfg.microbatches, cfg.chunks)
        check(schedule, microbatches=cfg.microbatches)
    except ScheduleHazard as err:
        raise UsageError(str(err).replace("\n ", ";")) from None    # one line
    except ValueError as err:
        raise UsageError(str(err)) from None
    if forward_only:
        schedule.actions = [[a for a in acts if a.op == "F"] for acts in schedule.actions]
        schedule.forward_only = True
    return schedule


def _read(path):
    from hpcpar.pipeline.csv_format import read
    try:
        return read(path)
    except (OSError, ValueError) as err:
        raise UsageError(f"--schedule-file {path}: {err}") from None
