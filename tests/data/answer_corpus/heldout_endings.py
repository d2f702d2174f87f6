r"""A second batch of endings, written after the rule was tuned on the first (:mod:`.gsm8k_endings`,
:mod:`.tag_endings`) and measured once before any change: the held-out check of docs/verifiers.md. Same fields and
classes as the first batch; different phrasings (other models' habits: headings, emoji, LaTeX display math, "**Final
Answer:**" blocks, R1-style "</think>" closings, numbered recaps).
"""

from __future__ import annotations

GSM8K = {
    "plain": [
        "**Final Answer:** $\\boxed{{{a}}}$", "### Answer\n#### {a}", "The correct answer is **{a}**.",
        "Final answer — {a}", "</think>\n\n#### {a}", "$$\\boxed{{{a}}}$$", "Hence, the answer is {a}.",
        "Answer:\n{a}", "The result is {a}.\n\n#### {a}", "So our final answer is {a}.",
    ],
    "sign_off": [
        "#### {a}\n\n🙂 Ping me if questions 4–6 give you trouble!",
        "**Answer: {a}**\n\nYou did great asking about this one. Keep going, 3 more to go and you're done!",
        "#### {a}\n---\nI'm always happy to help with math homework, even at 11 pm. 😉",
        "The answer is {a}.\n\nIf your class uses a different method (like the 2-column method), tell me and I'll redo it that way.",
        "#### {a}\nBest of luck on Friday's quiz (all 20 questions)!",
        "$\\boxed{{{a}}}$\n\nHope that helps. Next up: problem 3?",
        "#### {a}\n\nNote: I rounded nothing here; all 3 steps use whole numbers.",
        "Final answer: {a}\n\nThat wraps up part 1. Part 2 should take about 5 minutes.",
        "#### {a}\nEnjoy the rest of your day, and feel free to come back with the other 7 problems!",
        "So the answer is {a}. Thanks for the clear question; it had all 3 facts we needed!",
    ],
    "justification": [
        "#### {a}\n\n*Explanation:* {why}.", "The answer is **{a}** — {why}.", "**{a}**, since {why}.",
        "The answer is {a} (because {why}).", "#### {a}\nThis comes from the fact that {why}.",
        "So the answer is {a}; note that {why}.", "The answer is {a}, as shown above: {why}.",
        "#### {a}\n\n1. {why}\n2. That leads directly to {a}.", "Final answer: {a} — derived from: {why}.",
        "The answer is {a}. (Recall: {why}.)",
    ],
    "restatement": [
        "#### {a}\n\n> {restate}", "The answer is {a}.\n\nIn short: **{a}**{unit}.", "#### {a}\nYes, {a} is right: {restate}",
        "#### {a}\n\nRecap: {restate}", "**Answer:** {a}\n\nThat is, {restate_lc}", "#### {a}\nOur total: {a}.",
        "The answer is {a}{unit}. That's our final answer.", "#### {a}\n\nOnce again, the total is {a}.",
    ],
    "units": [
        "#### {cur}{a}{unit} ✅", "The answer is \\({cur}{a}\\){unit}.", "**Answer:** {a} ({unit_word})", "#### {a} {unit_word}.",
        "$\\boxed{{{a}\\ \\text{{{unit_word}}}}}$", "Final answer: {cur}{a}{unit}!", "#### **{cur}{a}**", "The answer is: {a}{unit}",
    ],
    "question": [
        "#### {a}\n\nDid you get the same thing?", "The answer is {a}. Are you working on the rest of chapter 3 too?",
        "#### {a}\nWant a challenge version where all the numbers are doubled (so {y} becomes twice as big)?",
        "**Answer:** {a}\n\nQuick check for you: what happens if there are 0 left over?",
        "#### {a}\n\nHow did your class set this up — with 1 equation or 2?", "#### {a}\nMake sense? 🙂",
        "$\\boxed{{{a}}}$\n\nIs there a particular step (1, 2, or 3) you'd like me to expand on?",
    ],
    "no_marker": [
        "{restate}\n\nI hope this was helpful, and good luck on question 2!", "{restate} 🎉 Let me know about the other 4 problems.",
        "{restate}\n\nWant me to check your answers to 1 and 2 as well?", "{restate} Thanks for asking!",
    ],
    "alternative": [
        "#### {x}\n\n(Or {y}, if the question meant something else.)", "The answer is {x}, although {y} is another possibility.",
        "#### {x} / {y}", "The answer is {x} — or, reading it differently, {y}.", "#### {x}\n\nEither {x} or {y}, depending on interpretation.",
        "**Answer:** {x} (alternatively {y})", "Final answer: {x}, possibly {y}.", "#### {x}\nAnother valid answer: {y}.",
        "The answer could be {x} or {y}.", "#### {x} (or maybe {y})",
    ],
    "hedge": [
        "#### {x}\n\nThough I'm not completely confident in step 2.", "The answer is roughly {x}.",
        "#### {x}\nPlease verify, as I may have misread the problem.", "The answer seems to be {x}.",
        "#### {x}\n\nI believe this is correct, but double-check with your teacher.", "It's probably {x}.",
        "#### {x}\nI'm fairly, but not entirely, sure.", "The answer is about {x}.", "#### ~{x}",
        "#### {x}\n\nThis is my best estimate.", "The answer is {x}, I think.",
    ],
    "correction": [
        "#### {x}\n\nWait — I misread. It should be {y}.", "The answer is {x}. Hmm, no. Recomputing: {y}.",
        "#### {x}\nCorrection: {y}.", "#### {x}\n\nActually the right answer is {y}; I forgot a step.",
        "The answer is {x}.\n\nUpdate: I made an arithmetic error. The answer is {y}.",
        "#### {x}\nOops, that should read {y}.", "#### {x}\n\nLet me fix that: {y}.", "#### {x}\nNo wait, {y}!",
        "The answer is {x}... actually, {y}.", "#### {x}\n\nOn reflection, {y}.",
    ],
    "two_answers": [
        "#### {x}\n\n---\n\n#### {y}", "**Answer:** {x}\n\n**Final Answer:** {y}", "The answer is {x}.\n\n$\\boxed{{{y}}}$",
        "#### {x}\nThe final answer is {y}.", "\\boxed{{{x}}}\n\n#### {y}", "Answer: {x}\n\nSo the answer is {y}.",
    ],
    "contradiction": [
        "#### {x}\n\nSo the answer comes out to {y}.", "#### {x}\n\n**{y}**", "The answer is {x}. Overall, {y}.",
        "#### {x}\nHence {y}.", "#### {x}\n\nAll in all, that's {y}.", "#### {x}\nIn total, {y}{unit}.",
        "#### {x}\n\n{restate_y}", "#### {x}\nTotal = {y}",
    ],
}

COUNTDOWN = {
    "plain": ["</think>\n<answer>{e}</answer>", "**Answer:** <answer>{e}</answer>", "<answer>{e}</answer>\n"],
    "format": ["<answer>{form}</answer>"],
    "sign_off": ["<answer>{e}</answer>\n\nThat was fun! Got another one with 5 numbers?",
                 "<answer>{e}</answer>\nHappy puzzling! 🧮 (Took me 2 tries.)",
                 "<answer>{e}</answer>\n\nI can also explain how I searched the 24 possible orderings if you're curious."],
    "justification": ["<answer>{e}</answer>\n\nVerification: {steps}.", "<answer>{e}</answer>\n(Steps: {steps}.)",
                      "<answer>{e}</answer>\nIt checks out since {steps}."],
    "restatement": ["<answer>{e}</answer>\n\nThis evaluates to {t}. ✓", "<answer>{e}</answer>\nWhich equals {t}, as required.",
                    "<answer>{e}</answer>\n\nSo we reach {t}."],
    "question": ["<answer>{e}</answer>\n\nShall I look for a solution using only 2 operations?",
                 "<answer>{e}</answer>\nDo you want the steps written out one by one?"],
    "wrong_value": ["<answer>{w}</answer>\n\nThat should do it!", "<answer>{w}</answer>\nDone. 🎉"],
    "alternative": ["<answer>{x}</answer>\n\nAnother option: {y}", "<answer>{x} (or {y})</answer>",
                    "<answer>{x}</answer>\nEither this or {y}."],
    "hedge": ["<answer>{x}</answer>\n\nI'm not certain this is valid.", "<answer>{x}</answer>\nProbably right, but please check.",
              "I believe the answer is <answer>{x}</answer>, though I'm unsure."],
    "correction": ["<answer>{x}</answer>\n\nWait, no. Let me fix it: <answer>{y}</answer>",
                   "<answer>{x}</answer>\nHmm, actually that's {v}. Never mind.", "<answer>{x}</answer>\nOops: should be {y}."],
    "two_answers": ["<answer>{x}</answer>\n\n<answer>{y}</answer>", "<answer>{x}</answer>\nFinal answer: <answer>{y}</answer>"],
    "contradiction": ["<answer>{e}</answer>\n\nThis gives {v}.", "<answer>{e}</answer>\nResult = {v}", "<answer>{e} = {v}.</answer>"],
}

REASONING_GYM = {
    "plain": ["</think>\n<answer>{a}</answer>", "**Final answer:** <answer>{a}</answer>", "<answer>{a}</answer>\n"],
    "format": ["<answer>{form}</answer>"],
    "sign_off": ["<answer>{a}</answer>\n\nThat was a nice one! Ready for 3 more?", "<answer>{a}</answer>\nGlad to help. 🙌 (Task 2 of 10 done.)",
                 "<answer>{a}</answer>\n\nFeel free to send another; I can do 5 in a row."],
    "justification": ["<answer>{a}</answer>\n\n(Checked twice, 2 different ways.)", "<answer>{a}</answer>\nThis matches the work in steps 1-3."],
    "restatement": ["<answer>{a}</answer>\n\nFinal: {a}", "<answer>{a}</answer>\nSo, {a}{unit}."],
    "question": ["<answer>{a}</answer>\n\nWant me to show a 2nd method?", "<answer>{a}</answer>\nShould I explain step 1?"],
    "wrong_value": ["<answer>{w}</answer>\n\nDone!", "<answer>{w}</answer>\nHope that's what you needed."],
    "alternative": ["<answer>{x}</answer>\n\nAnother possibility: {y}.", "<answer>{x} / {y}</answer>", "<answer>{x}</answer>\nOr possibly {y}."],
    "hedge": ["<answer>{x}</answer>\n\nNot completely sure about this.", "<answer>{x}</answer>\nThis is likely correct, but I may have slipped.",
              "<answer>approximately {x}</answer>"],
    "correction": ["<answer>{x}</answer>\n\nWait, I misread: {y}.", "<answer>{x}</answer>\nActually {y}.", "<answer>{x}</answer>\nNo, it's {y}."],
    "two_answers": ["<answer>{x}</answer>\n\nAnswer: {y}", "<answer>{x}</answer>\n\n<answer>{y}</answer> (final)"],
    "contradiction": ["<answer>{x}</answer>\n\nHence {y}.", "<answer>{x}</answer>\nResult: {y}", "<answer>{x}</answer>\n\n**{y}**"],
}
