"""`.ci/gpu-check`: the first contact with a lent GPU machine, prepared and tested on CPU.

One command (``fleetbench gpu-check``, which ``.ci/gpu-check`` runs under the present ``python3``): it picks the
interpreter the phases run under (:mod:`.interpreter`), runs each phase as a bounded subprocess (:mod:`.bounded`: a
hung phase is killed and marked, the later ones still run), and writes ``SUMMARY.md`` and at most seven more files
as each phase ends (:mod:`.summary`).  The phases (:mod:`.phases`): host facts, versions (:mod:`.versions`, run
under the chosen interpreter), the doctor, the premises probe (:mod:`.premises`), one case per strategy family of
the published models, and the nightly's plan from the measured step times.  This package imports no torch: the
phases that need it run it in their own process (docs/gpu.md, "The GPU check").
"""
