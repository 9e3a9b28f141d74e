"""Generated arithmetic (`a+b*c-d`, exact integer answers): the GSM8K pipeline at a size a CPU can learn.

Same prompts, reward and metrics as GSM8K (`ReasoningTask`): a few-shot "Question: … Answer:" prompt, 1 when the
last number of the response is the value of the expression. Term count, digit count and operators set the
difficulty, so a 135M model can solve some problems and learning shows on a CPU (`experiment=gsm8k_cpu`,
docs/method.md §8); Multiagent Finetuning's Arithmetic task reads the same problems (docs/method.md §7).

Problems are drawn with `seed`; duplicates are dropped (1-digit a±b has only 200 distinct questions), the first
`num_eval` distinct ones are held out and at most `num_train` of the others are used for training.
"""

from __future__ import annotations

from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

from cory.tasks.gsm8k import ReasoningTask
from cory.tasks.problems import arithmetic_problems


def arithmetic_task(
    tokenizer: PreTrainedTokenizerBase | None,
    num_train: int,
    num_eval: int,
    terms: Sequence[int],
    digits: Sequence[int],
    operators: str,
    pioneer_template: str,
    observer_template: str,
    stop_at_question: bool,
    max_new_tokens: Sequence[int],
    generation_kwargs: dict,
    eval_kl_coef: float,
    failure_reward: float,
    seed: int,
    name: str,
) -> ReasoningTask:
    """Integer expressions as a `ReasoningTask`, built from `cory/conf/task/arithmetic.yaml`. `tokenizer` is unused.

    Args:
        num_train, num_eval: training / held-out problems (at most; distinct questions).
        terms, digits: inclusive ranges of the operand count and of each operand's digit count.
        operators: the operators drawn from, any of "+-*".
        seed: seed of the problem draws.
        The other arguments are `ReasoningTask`'s.
    """
    drawn = arithmetic_problems(num_train + num_eval, seed, terms, digits, operators)
    distinct = list({p.question: p for p in drawn}.values())
    return ReasoningTask(
        distinct[num_eval : num_eval + num_train],
        distinct[:num_eval],
        pioneer_template,
        observer_template,
        stop_at_question,
        max_new_tokens,
        generation_kwargs,
        eval_kl_coef,
        failure_reward,
        name,
    )


# value ranges, checked before any model loads (cory/config.py `check_ranges`)
arithmetic_task.RANGES = {"num_train": "[1, inf)", "num_eval": "[1, inf)", "terms": "[1, inf)", "digits": "[1, inf)"}
