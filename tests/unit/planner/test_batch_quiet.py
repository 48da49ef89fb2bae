"""The batch solver writes nothing: HiGHS's copyright banner, printed when a process builds its first solver, must
not land in DDS's log (issue 30 part 6).

The banner comes once per process, so the first plan runs in a fresh interpreter; its stdout must hold exactly what
the script printed after planning (which also shows stdout works again once the banner is swallowed).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from dds.planner import plan_scale_up
from dds.model.plan import PlannerConfig
from tests.unit.planner.test_batch import _order_trap

ROOT = Path(__file__).resolve().parents[3]

FIRST_PLAN = textwrap.dedent("""
    import sys
    print("before the plan", flush=True)
    from dds.planner import plan_scale_up
    from dds.model.plan import PlannerConfig
    from tests.unit.planner.test_batch import _order_trap
    plan = plan_scale_up(_order_trap(), PlannerConfig(policy="spread", batch_solver="milp"))
    print(f"solver={plan.solver} nodes={plan.nodes} gpus={plan.gpus}", flush=True)
""")


def test_a_process_first_batch_plan_prints_no_banner() -> None:
    done = subprocess.run([sys.executable, "-c", FIRST_PLAN], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    # The MILP really ran (greedy would add a node here), and only the script's own lines came out.
    assert done.stdout == "before the plan\nsolver=milp nodes=0 gpus=0\n", done.stdout
    assert "HiGHS" not in done.stderr and "Copyright" not in done.stderr, done.stderr


def test_planning_writes_nothing_to_stdout_or_stderr(capfd) -> None:
    plan = plan_scale_up(_order_trap(), PlannerConfig(policy="spread", batch_solver="milp"))
    assert plan.solver == "milp"
    assert capfd.readouterr() == ("", "")
