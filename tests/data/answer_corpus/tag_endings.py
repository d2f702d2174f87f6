r"""Endings of ``<answer>``-tag replies (Countdown, reasoning-gym), by class: the tag's content in the forms models
write, and what they add after it (written for this corpus; none is copied from a model's output).

Countdown fields: ``{e}`` a correct equation in one of :data:`COUNTDOWN_FORMS`; ``{x}``/``{y}`` a correct and a wrong
equation, in both orders; ``{t}`` the target; ``{v}`` a value that is not the target; ``{k}`` how many numbers are
given; ``{steps}`` the equation's inner steps ("51 - 48 = 3"). reasoning-gym fields: ``{a}`` the reference in one of
:data:`REASONING_GYM_FORMS`; ``{x}``/``{y}`` the reference and a wrong answer, in both orders; ``{unit}`` the
dataset's unit word (" legs"), else "".
"""

from __future__ import annotations

# ------------------------------------------------------------------------------------------------ Countdown
COUNTDOWN_THINKING = [
    "<think>\nWe need {t} from {nums}. Let me try {n0} + {n1} = {s01}. That doesn't get there.\n"
    "What about {e_plain}? That gives {t}. Yes!\n</think>\n",
    "<think>\nTarget {t}, numbers {nums}. {n0} * {n1} = {p01}, too far off. Trying another order: {e_plain} = {t}.\n</think>\n",
    "Let me work through this. The numbers are {nums} and the target is {t}.\n{steps_lines}\nSo {e_plain} = {t}.\n",
    "<think>\nFirst attempt: {n1} - {n0} = {d10}... no. Second attempt: {e_plain}. Check: it equals {t} and uses each "
    "number once.\n</think>\n\n",
    "",
]
COUNTDOWN_FORMS = [  # a correct equation as models write it inside the tag
    "{e}", " {e} ", "\n{e}\n", "{e} = {t}", "{t} = {e}", "$ {e_latex} $", "\\( {e_latex} \\)", "**{e}**", "`{e}`",
    "{e_unicode}", "{e_x}", "{e}.", "$${e_latex} = {t}$$", "{e_nospace}", "({e})",
]
COUNTDOWN = {
    "plain": ["<answer>{e}</answer>", "<answer> {e} </answer>", "Answer: {e}", "<answer>\n{e}\n</answer>",
              "So the equation is:\n<answer>{e}</answer>", "Final answer: <answer>{e}</answer>"],
    "format": ["<answer>{form}</answer>"],
    "sign_off": [
        "<answer>{e}</answer>\n\nLet me know if you'd like a solution that uses only 3 of the {k} numbers!",
        "<answer>{e}</answer>\nHope this helps! Happy to try another target, like 100.",
        "<answer>{e}</answer>\n\nFun puzzle! Send me the next one whenever you like; I've solved 2 so far.",
        "<answer>{e}</answer>\nGood luck with the remaining 4 rounds!",
        "<answer>{e}</answer>\n\nFeel free to ask if you want me to explain step 2.",
        "<answer>{e}</answer>\nThat was a quick one: 1 try was enough. 😊",
    ],
    "justification": [
        "<answer>{e}</answer>\nThis works because {steps}.", "<answer>{e}</answer>\n\nCheck: {steps}, which is {t}.",
        "<answer>{e}</answer>\n(Each of the {k} numbers is used exactly once, and {steps}.)",
        "<answer>{e}</answer>\nReason: {steps}; the result is the target {t}.",
        "<answer>{e}</answer>\n\nWhy it works: {steps}.",
    ],
    "restatement": ["<answer>{e}</answer>\nSo {e_plain} = {t}.", "<answer>{e}</answer>\n\nThat gives exactly {t}.",
                    "<answer>{e}</answer>\nTherefore the equation equals {t}, the target.",
                    "<answer>{e}</answer>\nResult: {t} ✓"],
    "question": ["<answer>{e}</answer>\nWant me to find another way to make {t}?",
                 "<answer>{e}</answer>\n\nShould I also try it with all {k} numbers in a different order?",
                 "<answer>{e}</answer>\nCan you find one that avoids division? There are at least 2."],
    "wrong_value": ["<answer>{w}</answer>", "<answer>{w}</answer>\nLet me know if you want another one!",
                    "<answer>{w} = {t}</answer>", "Answer: {w}"],
    "alternative": ["<answer>{x} or {y}</answer>", "<answer>{x}</answer>\nOr: {y}",
                    "<answer>{x}</answer>\n\nAlternatively, {y} might also work.", "<answer>{x}, {y}</answer>",
                    "<answer>{x}</answer> (or maybe <answer>{y}</answer>)"],
    "hedge": ["<answer>{x}</answer>\nI'm not sure this uses each number only once.", "I think <answer>{x}</answer>",
              "<answer>{x}</answer>\n\nThis should probably work, but I might be wrong.",
              "<answer>{x}</answer>\nNot 100% confident in this one.", "<answer>{x}</answer>\nMaybe? It's close to {t}."],
    "correction": ["<answer>{x}</answer>\nWait, that's wrong. <answer>{y}</answer>",
                   "<answer>{x}</answer>\n\nActually, that gives {v}, not {t}.", "<answer>{x}</answer>\nOops, I meant {y}.",
                   "<answer>{x}</answer>\nHmm, let me recheck... that doesn't add up.",
                   "<answer>{x}</answer>\nCorrection: <answer>{y}</answer>"],
    "two_answers": ["<answer>{x}</answer>\n<answer>{y}</answer>", "<answer>{x}</answer>\n\nFinal: <answer>{y}</answer>",
                    "<answer>{x}</answer> and also <answer>{y}</answer>"],
    "contradiction": ["<answer>{e} = {v}</answer>", "<answer>{e}</answer>\nSo the result is {v}.",
                      "<answer>{e}</answer>\n{v}", "<answer>{e}</answer>\n\nThat comes to {v} in total.",
                      "<answer>{e}</answer>\nTotal: {v}"],
}

# ------------------------------------------------------------------------------------------- reasoning-gym
REASONING_GYM_FORMS = [  # the reference as models write it inside the tag
    "{a}", " {a} ", "\n{a}\n", "**{a}**", "{a}.", "`{a}`", "$\\boxed{{{a}}}$", "\\( {a} \\)", "$ {a} $", "\"{a}\"",
]
REASONING_GYM_NUMERIC_FORMS = ["{a}{unit}", "The answer is {a}", "{var}{a}", "{a} (final)", "**{a}**{unit}"]
REASONING_GYM = {
    "plain": ["<answer>{a}</answer>", "<answer> {a} </answer>", "Answer: {a}", "So the final answer is:\n<answer>{a}</answer>"],
    "format": ["<answer>{form}</answer>"],
    "sign_off": [
        "<answer>{a}</answer>\n\nLet me know if you want me to try the other 2 questions!",
        "<answer>{a}</answer>\nHope this helps! 😊", "<answer>{a}</answer>\n\nFeel free to ask about problem 3 too.",
        "<answer>{a}</answer>\nGood luck with the remaining 9 exercises!",
        "<answer>{a}</answer>\n\nHappy to walk through step 2 again if it's unclear.",
        "<answer>{a}</answer>\nThanks for the puzzle, that was number 5 today!",
    ],
    "justification": [
        "<answer>{a}</answer>\nThis follows from the 3 steps above.", "<answer>{a}</answer>\n\nI got this by working through the question step by step, as shown in steps 1 and 2.",
        "<answer>{a}</answer>\n(Derived directly from the work above.)",
        "<answer>{a}</answer>\nReason: each step above was checked once more, 2 times in total.",
    ],
    "restatement": ["<answer>{a}</answer>\nSo the answer is {a}.", "<answer>{a}</answer>\n\nThe final answer, once again: {a}.",
                    "<answer>{a}</answer>\nThat's {a}{unit}."],
    "question": ["<answer>{a}</answer>\nWould you like me to explain step 2 in more detail?",
                 "<answer>{a}</answer>\n\nDoes that match what you got? There are 2 common ways to check it.",
                 "<answer>{a}</answer>\nShall I try a harder version with 10 more items?"],
    "wrong_value": ["<answer>{w}</answer>", "<answer>{w}</answer>\nHope this helps!", "Answer: {w}"],
    "alternative": ["<answer>{x} or {y}</answer>", "<answer>{x}</answer>\nOr maybe {y}.", "<answer>{x}, {y}</answer>",
                    "<answer>{x}</answer>\n\nAlternatively, it could be {y}.", "<answer>{x} (or {y})</answer>"],
    "hedge": ["<answer>{x}</answer>\nI'm not sure about this one.", "I think <answer>{x}</answer>",
              "<answer>{x}</answer>\n\nThis is probably right, but I could be wrong.", "<answer>probably {x}</answer>",
              "<answer>{x}</answer>\nMy best guess."],
    "correction": ["<answer>{x}</answer>\nWait, actually it's {y}.", "<answer>{x}</answer>\n\nOops, I meant {y}.",
                   "<answer>{x}</answer>\nCorrection: <answer>{y}</answer>", "<answer>{x}</answer>\nHmm, no: {y}.",
                   "<answer>{x}</answer>\n\nOn second thought, {y}."],
    "two_answers": ["<answer>{x}</answer>\n<answer>{y}</answer>", "<answer>{x}</answer>\n\nFinal answer: <answer>{y}</answer>",
                    "<answer>{x}</answer> <answer>{y}</answer>"],
    "contradiction": ["<answer>{x}</answer>\nSo the result is {y}.", "<answer>{x}</answer>\n{y}",
                      "<answer>{x}</answer>\n\nTotal: {y}", "<answer>{x}</answer>\nTherefore {y}."],
}
