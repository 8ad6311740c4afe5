"""Planning a deployment (chapter 10): requirements → memory → hardware → cost → checklist.

``ServiceRequirements`` states what the service must do; ``plan_deployment(req, gpu, prices)`` walks
source 000's five steps with the course's own models (:mod:`llminfra.calc.memory`,
:mod:`llminfra.calc.roofline`, :mod:`llminfra.calc.cost`) and returns a :class:`Plan` with the
numbers behind each decision and the checklist evaluated; ``find_mistakes(draft)`` names the
common mistakes of a draft plan; :mod:`.commands` turns a plan's limits into the ``vllm serve``
and ``llminfra serve`` command lines. Taught in chapter 10.
"""

from llminfra.planning.commands import (EngineLimits, limits_for_plan, llminfra_command,
                                        vllm_command)
from llminfra.planning.mistakes import MISTAKES, DraftPlan, find_mistakes
from llminfra.planning.plan import Plan, PlanPrices, compare_gpus, plan_deployment
from llminfra.planning.requirements import ServiceRequirements, Traffic, traffic
from llminfra.planning.simulate import simulate_peak
from llminfra.planning.sizing import gpus_for_memory

__all__ = ["MISTAKES", "DraftPlan", "EngineLimits", "Plan", "PlanPrices", "ServiceRequirements",
           "Traffic", "compare_gpus", "find_mistakes", "gpus_for_memory", "limits_for_plan",
           "llminfra_command", "plan_deployment", "simulate_peak", "traffic", "vllm_command"]
