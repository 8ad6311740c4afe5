"""Planning a deployment (chapter 10): requirements → memory → hardware → cost → checklist.

``ServiceRequirements`` states what the service must do; ``plan_deployment(req, gpu, prices)`` walks
source 000's five steps with the course's own models (:mod:`llminfra.calc.memory`,
:mod:`llminfra.calc.roofline`, :mod:`llminfra.calc.cost`) and returns a :class:`Plan` with the
numbers behind each decision and the checklist evaluated; ``find_mistakes(draft)`` names the
common mistakes of a draft plan; :mod:`.commands` turns a plan's limits into the ``vllm serve``
and ``llminfra serve`` command lines, :mod:`.fleet` into the Helm values of vLLM's production stack
and llm-d, checked against each chart's schema; ``predict_latency`` gives the plan's TTFT and TPOT
(roofline bounds through efficiencies fitted to AIConfigurator's estimates for vLLM). Taught in
chapter 10.
"""

from llminfra.planning.commands import (EngineLimits, limits_for_plan, llminfra_command,
                                        vllm_command)
from llminfra.planning.fleet import (PrefillDecodeSplit, fleet_values, split_for_plan,
                                     validate_values)
from llminfra.planning.mistakes import MISTAKES, DraftPlan, find_mistakes
from llminfra.planning.plan import Plan, PlanPrices, compare_gpus, plan_deployment
from llminfra.planning.predict import predict_latency
from llminfra.planning.requirements import ServiceRequirements, Traffic, traffic
from llminfra.planning.simulate import simulate_peak
from llminfra.planning.sizing import gpus_for_memory

__all__ = ["MISTAKES", "DraftPlan", "EngineLimits", "Plan", "PlanPrices", "ServiceRequirements",
           "PrefillDecodeSplit", "Traffic", "compare_gpus", "find_mistakes", "fleet_values",
           "split_for_plan", "validate_values", "gpus_for_memory", "limits_for_plan",
           "llminfra_command", "plan_deployment", "predict_latency", "simulate_peak", "traffic", "vllm_command"]
