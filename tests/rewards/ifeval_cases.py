"""Responses written for the IFEval tests: for each of the 25 instruction types, replies that follow it,
replies that do not, and replies that pass only the loose evaluation (a chatty first line, markdown
``*``). Sentence- and word-counting cases lean on Punkt (abbreviations, initials, decimals)."""

from __future__ import annotations

LOREM = (
    "The river runs past the old mill and into the valley. Farmers bring their grain there every autumn. "
    "In winter the wheel stops and the village grows quiet. Children skate on the frozen pond."
)

# (instruction_id, kwargs, response)
CASES: list[tuple[str, dict, str]] = [
    # keywords
    ("keywords:existence", {"keywords": ["mill", "valley"]}, LOREM),
    ("keywords:existence", {"keywords": ["mill", "ocean"]}, LOREM),
    ("keywords:frequency", {"keyword": "the", "frequency": 5, "relation": "at least"}, LOREM),
    ("keywords:frequency", {"keyword": "the", "frequency": 5, "relation": "less than"}, LOREM),
    ("keywords:frequency", {"keyword": "mill", "frequency": 2, "relation": "less than"}, LOREM),
    ("keywords:forbidden_words", {"forbidden_words": ["ocean", "boat"]}, LOREM),
    ("keywords:forbidden_words", {"forbidden_words": ["ocean", "Mill"]}, LOREM),
    ("keywords:forbidden_words", {"forbidden_words": ["mil"]}, LOREM),  # whole words only
    ("keywords:letter_frequency", {"letter": "x", "let_frequency": 1, "let_relation": "less than"}, LOREM),
    ("keywords:letter_frequency", {"letter": "z", "let_frequency": 1, "let_relation": "less than"}, LOREM),
    ("keywords:letter_frequency", {"letter": "E", "let_frequency": 22, "let_relation": "at least"}, LOREM),
    ("keywords:letter_frequency", {"letter": "e", "let_frequency": 23, "let_relation": "at least"}, LOREM),
    # language
    ("language:response_language", {"language": "en"}, LOREM),
    ("language:response_language", {"language": "de"}, LOREM),
    ("language:response_language", {"language": "de"},
     "Der Fluss fließt an der alten Mühle vorbei und in das Tal. Die Bauern bringen jeden Herbst ihr Korn dorthin."),
    ("language:response_language", {"language": "fr"},
     "La rivière passe devant le vieux moulin et descend dans la vallée. Les enfants patinent sur l'étang gelé."),
    ("language:response_language", {"language": "hi"}, "नदी पुरानी चक्की के पास से बहती है और घाटी में जाती है।"),
    # sentences (Punkt): abbreviations and initials must not split, decimals must not split
    ("length_constraints:number_sentences", {"num_sentences": 4, "relation": "at least"}, LOREM),
    ("length_constraints:number_sentences", {"num_sentences": 4, "relation": "less than"}, LOREM),
    ("length_constraints:number_sentences", {"num_sentences": 3, "relation": "less than"},
     "Dr. Smith met Mr. J. R. Jones at 5 p.m. in Washington D.C. on Jan. 3. They paid $3.50 each. It rained."),
    ("length_constraints:number_sentences", {"num_sentences": 3, "relation": "at least"},
     "Dr. Smith met Mr. J. R. Jones at 5 p.m. in Washington D.C. on Jan. 3. They paid $3.50 each. It rained."),
    ("length_constraints:number_sentences", {"num_sentences": 2, "relation": "less than"},
     "The U.S. economy grew by 2.5 percent, e.g. in Calif. and Fla. Prof. Lee agreed!"),
    ("length_constraints:number_sentences", {"num_sentences": 2, "relation": "at least"},
     "Is it ready? Yes! It is... mostly. Ok."),
    # paragraphs
    ("length_constraints:number_paragraphs", {"num_paragraphs": 3}, "First part.\n***\nSecond part.\n***\nThird part."),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 3}, "First part.\n***\nSecond part."),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "One.\n***\n***\nTwo."),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "Here you go:\nOne.\n***\nTwo.\n***"),
    # words
    ("length_constraints:number_words", {"num_words": 40, "relation": "less than"}, LOREM),
    ("length_constraints:number_words", {"num_words": 40, "relation": "at least"}, LOREM),
    ("length_constraints:number_words", {"num_words": 4, "relation": "less than"}, "Well-known e-mail isn't"),
    # nth paragraph first word
    ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 3, "nth_paragraph": 2, "first_word": "winter"},
     "Autumn comes.\n\nWinter, then, is cold.\n\nSpring follows."),
    ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 3, "nth_paragraph": 2, "first_word": "winter"},
     "Autumn comes.\n\nSummer is hot.\n\nSpring follows."),
    ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 2, "nth_paragraph": 1, "first_word": "autumn"},
     "Autumn comes.\n\nSummer is hot.\n\nSpring follows."),
    ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "spring"},
     "**Autumn** comes.\n\n*Spring* follows."),
    # placeholders
    ("detectable_content:number_placeholders", {"num_placeholders": 2}, "Dear [name], meet me at [address]."),
    ("detectable_content:number_placeholders", {"num_placeholders": 2}, "Dear [name], meet me at home."),
    # postscript
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, LOREM + "\n\nP.S. Bring a coat."),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, LOREM),
    ("detectable_content:postscript", {"postscript_marker": "P.P.S"}, LOREM + "\n\nP. P. S. See you."),
    ("detectable_content:postscript", {"postscript_marker": "PS:"}, LOREM + "\nps: bye"),
    # bullets
    ("detectable_format:number_bullet_lists", {"num_bullets": 3}, "Items:\n* one\n* two\n- three"),
    ("detectable_format:number_bullet_lists", {"num_bullets": 3}, "Items:\n* one\n* two"),
    ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "Items:\n* one\n* two\n**Note**: bold is not a bullet"),
    ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "Sure:\n* one\n* two\n- thanks for asking"),
    # constrained response
    ("detectable_format:constrained_response", {}, "Let me think. My answer is yes."),
    ("detectable_format:constrained_response", {}, "My answer is: yes"),
    # highlights
    ("detectable_format:number_highlighted_sections", {"num_highlights": 2}, "*one* and **two** are key."),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 2}, "*one* and ** ** are key."),
    # sections
    ("detectable_format:multiple_sections", {"section_spliter": "SECTION", "num_sections": 2},
     "SECTION 1\nIntro.\nSECTION 2\nBody."),
    ("detectable_format:multiple_sections", {"section_spliter": "Section", "num_sections": 3},
     "Section 1\nIntro.\nSection 2\nBody."),
    ("detectable_format:multiple_sections", {"section_spliter": "PARAGRAPH", "num_sections": 2},
     "PARAGRAPH 1 Intro. PARAGRAPH 2 Body."),
    # json
    ("detectable_format:json_format", {}, '```json\n{"answer": 42, "items": [1, 2]}\n```'),
    ("detectable_format:json_format", {}, '{"answer": 42,}'),
    ("detectable_format:json_format", {}, 'Here is the JSON:\n{"answer": 42}'),
    # title
    ("detectable_format:title", {}, "<<A Winter Tale>>\n" + LOREM),
    ("detectable_format:title", {}, "<<>>\n" + LOREM),
    ("detectable_format:title", {}, "A Winter Tale\n" + LOREM),
    # two responses
    ("combination:two_responses", {}, "First answer.\n******\nSecond answer."),
    ("combination:two_responses", {}, "Same answer.\n******\nSame answer."),
    ("combination:two_responses", {}, "One.\n******\nTwo.\n******\nThree."),
    # repeat prompt
    ("combination:repeat_prompt", {"prompt_to_repeat": "Write a poem about rain."},
     "Write a poem about rain. Rain falls on the roof."),
    ("combination:repeat_prompt", {"prompt_to_repeat": "Write a poem about rain."},
     "Rain falls on the roof. Write a poem about rain."),
    ("combination:repeat_prompt", {"prompt_to_repeat": "Write a poem about rain."},
     "Sure!\nWrite a poem about rain.\nRain falls on the roof."),
    # end checker
    ("startend:end_checker", {"end_phrase": "Is there anything else I can help with?"},
     LOREM + " Is there anything else I can help with?"),
    ("startend:end_checker", {"end_phrase": "Is there anything else I can help with?"},
     LOREM + " Is there anything else I can help with? Bye."),
    ("startend:end_checker", {"end_phrase": "Peace!"}, LOREM + "\nPeace!\n(Word count: 40)"),
    # capital words (nltk.word_tokenize, which runs Punkt)
    ("change_case:capital_word_frequency", {"capital_frequency": 3, "capital_relation": "at least"},
     "The NASA and ESA teams met the U.S. DOE. OK?"),
    ("change_case:capital_word_frequency", {"capital_frequency": 2, "capital_relation": "less than"},
     "The NASA and ESA teams met the U.S. DOE. OK?"),
    ("change_case:capital_word_frequency", {"capital_frequency": 2, "capital_relation": "less than"},
     "Only NASA here, and Mr. Smith."),
    # all capitals / lowercase (also run language detection)
    ("change_case:english_capital", {}, "THE RIVER RUNS PAST THE OLD MILL AND INTO THE VALLEY."),
    ("change_case:english_capital", {}, "THE RIVER RUNS PAST THE OLD MILL and into the valley."),
    ("change_case:english_capital", {}, "DER FLUSS FLIESST AN DER ALTEN MÜHLE VORBEI UND IN DAS TAL."),
    ("change_case:english_lowercase", {}, LOREM.lower()),
    ("change_case:english_lowercase", {}, LOREM),
    ("change_case:english_lowercase", {}, "Sure! Here it is:\n" + LOREM.lower()),
    # commas
    ("punctuation:no_comma", {}, "No commas here at all."),
    ("punctuation:no_comma", {}, "Yes, a comma."),
    # quotation
    ("startend:quotation", {}, '"' + LOREM + '"'),
    ("startend:quotation", {}, LOREM),
    ("startend:quotation", {}, 'Here you go:\n"' + LOREM + '"'),
    ("startend:quotation", {}, '**"' + LOREM + '"**'),
]

RESPONSE_POOL: list[str] = [
    LOREM,
    "",
    "   \n  ",
    "Sure, here it is!\n<<A Short Story>>\n\n" + LOREM + "\n\nP.S. " + LOREM.lower(),
    '"' + LOREM.upper() + '"',
    "My answer is yes. " + LOREM.lower().replace(",", ""),
    "SECTION 1\n* first point\n* second point\n* third point\n\nSECTION 2\n*highlighted* and *another* "
    "[place] [holder] text.\n******\nA second, different answer. Is there anything else I can help with?",
    '```json\n{"title": "rain", "lines": ["It rains.", "It pours."]}\n```',
    "Dr. J. R. Smith arrived at 5 p.m. on Jan. 3 in the U.S. He paid $3.50. NASA AND ESA AGREED. "
    + "\n\n".join(["Paragraph one is here.", "Paragraph two follows.", "Paragraph three ends."]),
    "Der Fluss fließt an der alten Mühle vorbei und in das Tal.\n***\nLes enfants patinent sur l'étang gelé.",
    "\n".join(f"- bullet {i} about the river and the mill" for i in range(8)) + "\n***\nThe end. Peace!",
]
"""Responses scored against every one of the 541 IFEval rows in the agreement test."""
