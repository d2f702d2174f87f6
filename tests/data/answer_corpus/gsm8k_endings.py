r"""Endings of GSM8K replies, by class: how chat models close a solution (written for this corpus, in the voices of
instruction-tuned models; none is copied from a model's output).

Fields: ``{a}`` the answer as the reply writes it; ``{x}``/``{y}`` the stated answer and another value (an intermediate
result of the same solution, or the answer itself, in both orders); ``{why}`` an earlier step of the worked solution
as a clause ("Janet sells 16 - 3 - 4 = 9 duck eggs a day"); ``{restate}`` the solution's last sentence;
``{restate_y}`` that sentence with the answer replaced by ``{y}``; ``{cur}`` "$" when the answer is money; ``{unit}``
the word after the answer in the solution (" minutes"), else "".

A class is *correct* (the reply states one answer: a false negative if refused) or *wrong* (it states no single answer,
or a wrong one: a false positive if paid).
"""

from __future__ import annotations

# ---------------------------------------------------------------------------------------------- correct
PLAIN = [
    "#### {a}", "The answer is {a}.", "The final answer is {a}.", "**Answer:** {a}", "Final Answer: {a}", "A: {a}",
    "Answer: {a}", "$\\boxed{{{a}}}$", "\\[\n\\boxed{{{a}}}\n\\]", "So the answer is \\boxed{{{a}}}.",
    "Therefore, the answer is {a}.", "####{a}", "#### {a}\n", "**Final Answer**\n\n\\boxed{{{a}}}",
    "The final answer is $\\boxed{{{a}}}$.", "So, the answer is **{a}**.", "Thus the answer is {a}.",
    "Final answer: **{a}**", "#### **{a}**", "### Final Answer\nThe answer is {a}.",
]

SIGN_OFF = [
    "#### {a}\nLet me know if you need help with the other 2 questions!",
    "#### {a}\n\nI hope this helps! Feel free to ask about problem 2.",
    "The answer is {a}.\n\nHappy to walk through step 2 again if anything is unclear.",
    "#### {a}\nGood luck with the rest of your 10-question worksheet!",
    "#### {a}\n\nThat's question 1 of 5 done. Send the next one whenever you're ready.",
    "**Answer:** {a}\n\nLet me know if you'd like 3 more practice problems like this one.",
    "#### {a}\nHope this helps! 😊",
    "The final answer is {a}. If you have 2 or 3 similar problems, I can solve those too.",
    "#### {a}\n\nFeel free to send over the next 5 problems!",
    "\\boxed{{{a}}}\n\nI hope that clears it up. Let me know if there's anything else in chapter 4 you'd like to go over.",
    "#### {a}\nThanks for the fun puzzle, 10/10 would solve again!",
    "Answer: {a}\n\nIf you want, I can also show a 2-step shortcut for this kind of problem.",
    "#### {a}\n\nGlad I could help! Don't hesitate to reach out about the other 4 exercises.",
    "So the answer is {a}. Good luck on your test on the 12th!",
    "#### {a}\nLet me know if any of the 3 steps above need more detail.",
    "The answer is **{a}**. 🎉 You've got this, only 2 more problems to go!",
    "#### {a}\n\nIs there anything else I can help you with today? I'm happy to tackle problem 7 next.",
    "Final answer: {a}\n\nCheers, and good luck with the other 9 questions on the sheet!",
    "#### {a}\nP.S. Step 2 is where most people slip up, so double-check it on your own worksheet.",
    "#### {a}\n\nIf I made a mistake anywhere, just let me know and I'll fix it.",
    "The answer is {a}.\n\nLet me know if you spot any errors in my 3-step breakdown!",
    "#### {a}\nHave a great day, and good luck with question #3!",
    "#### {a}\n\nThis was a nice 2-step problem. Let me know when you want to try a harder one!",
    "**The answer is {a}.**\n\nI hope you enjoyed the 2 puzzles today!",
    "#### {a}\nFeel free to reach out 24/7 if you get stuck again.",
    "The final answer is {a}.\n\nHappy studying, and good luck on the 3 remaining units of your course!",
    "#### {a}\n\n---\n*Tip: for problems like #4 on your sheet, drawing a quick table helps.*",
    "$\\boxed{{{a}}}$\n\nI hope this explanation helps! Let me know if you want me to go over any of the 3 steps again.",
    "#### {a}\nThat's it! If your teacher asked for the work too, the 2 lines above are all you need.",
    "Answer: **{a}**\n\nLet me know if you have any other questions. I'm here to help with all 12 of them if needed!",
]

JUSTIFICATION = [
    "The answer is {a}, since {why}.", "The answer is {a} because {why}.", "#### {a}\n(This is because {why}.)",
    "#### {a}\n\nThis works out because {why}.", "**Answer: {a}**, because {why}.", "The answer is {a}: {why}.",
    "The final answer is {a}, as {why}.", "#### {a}\nReason: {why}.", "So the answer is {a}, given that {why}.",
    "Answer: {a} ({why})", "The answer is {a}; {why}.", "{a} is the answer, since {why}.",
    "The answer is {a}, which follows from the fact that {why}.", "\\boxed{{{a}}}, because {why}.",
    "#### {a}\nThat's the answer since {why}.", "The answer is {a}. Here's why: {why}.",
    "The answer is {a}, after accounting for the fact that {why}.", "#### {a}\n\nWhy? Because {why}.",
    "The final answer is **{a}** (since {why}).", "So the answer is {a}, as we found that {why}.",
    "#### {a}\n\n**Why:** {why}.", "The answer is {a}, because first {why}, and the rest follows.",
    "Final answer: {a}, given that {why}.", "The answer is $\\boxed{{{a}}}$ since {why}.",
    "#### {a}\nKey step: {why}.", "The answer is {a}. This is because {why}.",
]

RESTATEMENT = [
    "#### {a}\n{restate}", "The answer is {a}. {restate}", "#### {a}\n\nSo, in short: {restate}",
    "{restate}\nThe answer is {a}.", "#### {a}\nIn other words, the answer is {a}.",
    "**Final answer:** {a}\n\nTo recap: {restate}", "#### {a}\nThat's {a}{unit} in total.",
    "\\boxed{{{a}}}\n\nSo the final result is {a}.", "#### {a}\n\nTherefore: {restate}",
    "The answer is {a}. Once more: {a}.", "#### {a}\n\n**Summary:** {restate}",
    "The answer is {a}.\n\nSo yes, {a}{unit} it is!", "#### {a}\n{restate} That's the final answer: {a}.",
    "{restate}\n\n#### {a}\n\nSo the answer is {a}.", "The final answer is {a}{unit}. {restate}",
    "#### {a}\nThe total comes to {a}{unit}.", "So the answer is **{a}**.\n\n{restate}",
    "#### {a}\n\nIn summary, {a}{unit}.", "The answer is {a}. To double-check: {restate}",
    "#### {a}\nThus the total is {a}.",
]

UNITS = [  # the answer with currency, units, separators, markdown or LaTeX around it
    "#### {cur}{a}{unit}", "The answer is {cur}{a}{unit}.", "**Answer:** **{cur}{a}**{unit}",
    "\\boxed{{{a}\\text{{{unit}}}}}", "The answer is $\\boxed{{{a}}}${unit}.", "Final answer: `{a}`",
    "## Final Answer\n\n**{cur}{a}**{unit}", "#### {a} ({unit_word})", "Answer: {a}{unit} in total.",
    "#### {cur}{a}.00", "The answer is {cur}{a}{unit} per the question.", "The final answer is \\({a}\\){unit}.",
    "#### {a}{unit}.", "**Final answer: {cur}{a}{unit}**", "$\\boxed{{\\text{{{cur}}}{a}}}$",
    "The answer is {a}{unit} (exactly).", "#### {a} {unit_word} in all", "Answer: {cur}{a}.0",
    "The final answer is **{a}**{unit}.", "> #### {a}",
]

QUESTION = [
    "#### {a}\nDoes that make sense?",
    "#### {a}\n\nWould you like me to show how to check this with the 2 numbers from the question?",
    "The answer is {a}. Want me to walk through step 3 in more detail?",
    "#### {a}\nShould I also solve part (b), the one with {y}?",
    "**Answer:** {a}\n\nCan you see why {y} isn't the right count here?",
    "#### {a}\n\nHow would the answer change if there were 2 more? Try it!",
    "The answer is {a}. Do you want to try a similar one with {y} instead?",
    "#### {a}\nAny questions about the 2 steps above?",
    "\\boxed{{{a}}}\n\nDid your teacher want the answer in dollars or cents?",
    "#### {a}\n\nWant me to turn this into a 3-question practice quiz?",
    "The final answer is {a}.\n\nWould it help if I drew a diagram for step 1?",
    "#### {a}\nIs this for a class? I can explain it at a 5th-grade level if that's useful.",
    "Answer: {a}\n\nShall I show the same problem solved with algebra, using 1 equation?",
    "#### {a}\n\nWhat would you get if the 2 was a 3? Give it a try!",
    "The answer is **{a}**. Does this match the answer key for question 6?",
    "#### {a}\nCould you share the next problem? I think it continues from question 2.",
    "#### {a}\n\nWould you like a version of this problem with 4 people instead?",
    "So the answer is {a}. Can I help with anything else from page 12?",
]

NO_MARKER = [  # the env asks for "#### N"; chat models do not always write it
    "{restate} Let me know if you need help with the other 2 questions!",
    "{restate}\n\nHope this helps! Feel free to ask about problem 2.", "{restate} Does that make sense?",
    "{restate} 😊 Good luck with the other 3!", "{restate}\n\nWould you like me to explain step 2 again?",
    "{restate}\n\nLet me know if there's anything else I can help with, like the 4 remaining problems.",
    "{restate} I hope this helps!", "{restate}\n\nHappy to help with questions 5 through 8 too.",
]

# ------------------------------------------------------------------------------------------------- wrong
ALTERNATIVE = [
    "#### {x} or {y}", "#### {x}\nor {y}", "The answer is {x} or {y}.",
    "The answer is {x} (or {y}, depending on how you count).", "#### {x}\n\nAlternatively, it could be {y}.",
    "\\boxed{{{x}}} or \\boxed{{{y}}}", "The answer is either {x} or {y}.", "#### {x}. Or {y}.",
    "**Answer:** {x}, or possibly {y}", "#### {x}\n{y} is also possible if you read the question differently.",
    "The answer is {x}, but it could also be {y}.", "#### {x}\nOr maybe {y}.", "#### {x}-{y}",
    "The answer is somewhere between {x} and {y}.", "#### {x}\n(or {y} if you round differently)",
    "The answer is {x}, or {y} if we count the last one too.", "Final answer: {x} / possibly {y}",
    "#### {x}\n\nThough {y} would also be a reasonable answer.", "The answer is {x}, {y}.",
    "#### {x}, or {y}", "The answer is {x} to {y}.", "\\boxed{{{x} \\text{{ or }} {y}}}",
]

HEDGE = [
    "#### {x}\nBut I'm not 100% sure about this.", "The answer is probably {x}.",
    "#### {x}\n\nI might be wrong, though. It's a tricky one.", "I think the answer is {x}, but I'm not certain.",
    "#### {x}\nMaybe {y}? I'm not sure.", "The answer is approximately {x}.", "#### {x}\nGive or take a few.",
    "The answer should be around {x}.", "#### {x} (if my math is right)",
    "**Answer:** {x}, I believe, though I'm not fully confident.", "#### {x}\nI'm guessing here, so take it with a grain of salt.",
    "My best guess is {x}.", "#### {x}\n\nIf I'm not mistaken, that's it.", "The answer is likely {x}.",
    "#### {x}?\nNot totally sure.", "#### {x}\nI could be off by a little here.", "The answer is {x}, more or less.",
    "#### {x}\nThat's my estimate.", "#### {x}\n\nI think that's right, but it might be {y}.",
    "Probably {x}.", "#### {x}\nRoughly, anyway.", "The answer is {x}ish.",
    "#### {x}\n\nI'm not entirely sure I read the question right, so please check.", "I'd say {x}, maybe.",
]

CORRECTION = [
    "#### {x}\nActually, {y}.", "#### {x}\n\nWait, I made an error: it is {y}.", "#### {x}\nOops, I meant {y}.",
    "The answer is {x}. No, wait, it's {y}.", "#### {x}\nCorrection: the answer is {y}.",
    "#### {x}\n\nHmm, let me recheck... it should be {y}.", "#### {x}\nOn second thought, it's {y}.",
    "The answer is {x}. Actually, scratch that: {y}.", "#### {x}\nSorry, I miscounted. It's {y}.",
    "#### {x}\n\nEdit: I forgot one step, so it's {y}.",
    "**Answer:** {x}\n\nWait, that's wrong. The correct answer is {y}.", "#### {x}\nNo, {y}.",
    "#### {x}\nMy mistake, it's actually {y}.", "The answer is {x}. Hold on, I double-counted; it's {y}.",
    "#### {x}\nI made a typo above: {y}.", "#### {x}\nThat's incorrect. I should have subtracted first, giving {y}.",
    "#### {x}\n\nActually, I think I misread the question. It's {y}.", "The answer is {x}.\nOops! {y}, not {x}.",
    "#### {x}\nWait, {y}.", "#### {x}\n\nLet me redo that: {why}, so {y}.",
    "#### {x}\nHmm, {y}.", "The answer is {x}... no, {y}.",
]

TWO_ANSWERS = [
    "#### {x}\n#### {y}", "#### {x}\n\nThe answer is {y}.", "The answer is {x}.\n#### {y}",
    "\\boxed{{{x}}}\n\nFinal answer: \\boxed{{{y}}}", "**Answer:** {x}\n\n#### {y}", "Answer: {x}\nFinal answer: {y}",
    "#### {x}\n\nSo the final answer is {y}.", "The answer is \\boxed{{{x}}}.\n\n#### {y}", "#### {x}\nA: {y}",
    "The final answer is {x}. The answer is {y}.", "#### {x}\n\n**Final Answer:** {y}", "\\boxed{{{x}}} \\boxed{{{y}}}",
    "The answer is {x}.\n\nFinal Answer: The final answer is {y}.", "#### {x}\n\n$\\boxed{{{y}}}$",
]

CONTRADICTION = [  # an answer, then a different number stated as the result
    "#### {x}\nSo the total is {y}.", "#### {x}\n{y}", "#### {x}\nTotal: {y}", "The answer is {x}. So that's {y} in total.",
    "#### {x}\n\nTherefore, the result is {y}.", "#### {x}\n= {y}", "#### {x}\nThus {y}.", "#### {x}\n\nIn total: {y}.",
    "The answer is {x}.\n\n**{y}**", "#### {x}\nThat means {y} altogether.", "#### {x}\nSo {y}.",
    "#### {x}\n\nFinal result: {y}", "#### {x}\n{restate_y}", "The answer is {x}. {restate_y}",
    "#### {x}\n\nSo, overall, {y}{unit}.", "#### {x}\nResult: {y}",
]

# ---------------------------------------------------------------------- the Python tool's final reply
TOOL_BODIES = [
    "The code printed `{a_run}`.", "Running the script gives {a_run}.", "The Python output is {a_run}, as expected.",
    "I ran the calculation in Python and got `{a_run}`.", "The interpreter returned {a_run}.",
    "The tool output confirms the arithmetic: `{a_run}`.",
]
TOOL = {
    "plain": ["#### {a}", "So the answer is {a}.\n#### {a}", "{restate}\n\n#### {a}", "Final answer:\n#### {a}",
              "The answer is **{a}**.", "\\boxed{{{a}}}", "**Final answer:** {a}", "#### ${a}"],
    "sign_off": [
        "#### {a}\n\nLet me know if you'd like me to run the other 2 problems through Python too!",
        "#### {a}\nHappy to share the 5-line script if you want to reuse it.",
        "#### {a}\n\nFeel free to tweak the 3 variables at the top of the script and re-run it yourself.",
        "#### {a}\nHope this helps! The code is easy to adapt for problem 2.",
        "#### {a}\n\nIf you have more questions like this (say, all 10 from the worksheet), send them over.",
        "#### {a}\nGlad the sandbox ran it in under 1 second. Let me know what's next!",
    ],
    "justification": [
        "#### {a}\n\nThe script computes it the same way I did by hand: {why}.",
        "The answer is {a}, since the code checks that {why}.\n\n#### {a}",
        "#### {a}\n(The code follows the steps: {why}.)", "#### {a}\n\nThis matches the manual check, because {why}.",
        "#### {a}\nThe output is exact (integer arithmetic), since {why}.",
    ],
    "restatement": ["#### {a}\n{restate}", "#### {a}\n\nSo the script confirms it: {a}.",
                    "#### {a}\nThe printed value, {a}, is the final answer."],
    "question": ["#### {a}\n\nWant me to add a unit test with 2 more cases to double-check the script?",
                 "#### {a}\nShould I print the 3 intermediate values as well?",
                 "#### {a}\n\nWould you like the code as a reusable function for the other 4 problems?"],
    "alternative": ["#### {x}\n\nOr {y}, if the script's rounding is off.", "#### {x} or {y}",
                    "#### {x}\nThe code also suggests {y} might be right."],
    "hedge": ["#### {x}\n\nI'm not fully sure the code models the problem correctly, though.",
              "#### {x}\nThis is probably right, assuming the script is correct.", "#### {x}\nGive or take rounding."],
    "correction": ["#### {x}\n\nHmm, the code printed {y} though. Let me re-run it.", "#### {x}\nWait, the output says {y}.",
                   "#### {x}\nActually, the script gives {y}, so the answer is {y}.",
                   "#### {x}\n\nOops, I had a typo in the code; the correct result is {y}."],
    "two_answers": ["#### {x}\n\nThe code output: #### {y}", "#### {x}\nThe answer is {y}."],
    "contradiction": ["#### {x}\n\nSo the final printed total is {y}.", "#### {x}\nResult: {y}", "#### {x}\n{y}"],
}
