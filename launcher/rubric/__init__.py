"""``rollbridge eval rubric``: an LLM judge over JSONL conversations or a run's rollouts.

Modules, in the order a call passes through them: :mod:`~launcher.rubric.inputs` (rubric and
records), :mod:`~launcher.rubric.runsource` (records of a run directory),
:mod:`~launcher.rubric.prompt` (the judge's messages), :mod:`~launcher.rubric.provider` and
:mod:`~launcher.rubric.judge` (one call through the bridge's upstream paths),
:mod:`~launcher.rubric.engine` (concurrency), :mod:`~launcher.rubric.store` (verdicts kept in
the run directory), :mod:`~launcher.rubric.stats`, :mod:`~launcher.rubric.report` and
:mod:`~launcher.rubric.render` (results), :mod:`~launcher.rubric.command` (the command).

Nothing is imported here, so that registering the command (:mod:`launcher.rubric.cli`) keeps
``rollbridge --help`` fast.
"""
