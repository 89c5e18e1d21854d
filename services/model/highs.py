"""A quiet HiGHS: the solver prints a banner on stdout (at C level) the first time a
``Highs`` object is built in a process, even with ``output_flag`` off. `new_highs` builds
that first object with stdout pointed at /dev/null, so command output (e.g. ``--json``)
stays clean; later objects print nothing anyway."""

from __future__ import annotations

import os
import sys

import highspy

_banner_done = False


def new_highs() -> highspy.Highs:
    """A ``highspy.Highs`` with ``output_flag`` off, the one-time banner suppressed."""
    global _banner_done
    if not _banner_done:
        _banner_done = True
        sys.stdout.flush()
        try:
            saved = os.dup(1)
        except OSError:  # no stdout to silence
            saved = -1
        if saved >= 0:
            try:
                with open(os.devnull, "w") as devnull:
                    os.dup2(devnull.fileno(), 1)
                    h = highspy.Highs()
            finally:
                os.dup2(saved, 1)
                os.close(saved)
            h.setOptionValue("output_flag", False)
            return h
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    return h
