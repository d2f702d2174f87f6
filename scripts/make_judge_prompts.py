"""Write the judged learning run's prompts: everyday requests with one instruction a rule can check.

    python -m scripts.make_judge_prompts --family lowercase     # examples/data/judge_lowercase_{train,test}.jsonl

Each row is an IFEval record (``prompt``, ``instruction_id_list``, ``kwargs``: ``LLMIFEval-v0`` checks it with
IFEval's own checker) plus ``criterion``, the sentence the judge's rubric quotes (``LLMChat-v0`` keeps it in the
task's record). The same rows serve both envs: training reads them through ``LLMChat-v0`` with the judge as the
reward, evaluation through ``LLMIFEval-v0`` on the held-out file. Topics are split between the files, so no held-out
request was trained on. Deterministic: the same command writes the same files.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

TOPICS = [
    "the water cycle", "photosynthesis", "how vaccines work", "the history of the bicycle", "black holes",
    "the causes of inflation", "how a refrigerator works", "the rules of chess", "coral reefs", "the printing press",
    "volcanoes", "how to brew tea", "the Roman Empire", "solar panels", "honeybees", "the stock market",
    "how airplanes fly", "the human heart", "recycling plastic", "the moon landing", "earthquakes", "jazz music",
    "how to plant tomatoes", "the internet", "rainbows", "the Great Wall of China", "electric cars", "sleep",
    "the Olympic Games", "dinosaurs", "how a camera works", "the French Revolution", "tides", "compost",
    "the immune system", "wind turbines", "the Amazon rainforest", "how to learn a language", "glaciers",
    "the piano", "antibiotics", "the periodic table", "time zones", "penguins", "how bread rises", "lightning",
    "the Silk Road", "public libraries", "how maps are made", "the Eiffel Tower", "deserts", "chocolate",
    "how to save money", "the speed of light", "mushrooms", "the theory of evolution", "hurricanes", "origami",
    "the blood types", "lighthouses", "how to run a marathon", "the Renaissance", "octopuses", "batteries",
    "how elections work", "the Sahara", "coffee", "gravity", "the Nile", "how to write a poem", "sharks",
    "democracy in ancient Athens", "snowflakes", "the metric system", "how to care for a cat", "comets",
    "the first computers", "wolves", "how soap cleans", "the ozone layer", "paper", "the violin", "caves",
    "how to make a budget", "the Industrial Revolution", "whales", "telescopes", "the Arctic", "rice farming",
    "how noise-cancelling headphones work", "the Mona Lisa", "bridges", "owls", "the Panama Canal", "yoga",
    "how a bill becomes a law", "butterflies", "the Himalayas", "clocks", "microplastics", "the violin family",
    "how to give a good presentation", "the Pyramids of Giza", "cactus plants", "the Wright brothers",
    "how recycling glass works", "autumn leaves", "the saxophone", "elephants", "the water table", "fireworks",
    "how to study for an exam", "the Vikings", "submarines", "tea ceremonies", "the solar system", "bamboo",
    "how credit cards work", "the Moon's phases", "frogs", "the Dead Sea", "how to make friends", "radio",
    "the Andes", "pottery", "how a thermostat works", "the Aztecs", "seahorses", "hot air balloons", "salt",
]

ASKS = ["Describe {t}.", "Explain {t} to a curious twelve-year-old.", "Write a short paragraph about {t}.",
        "What should everyone know about {t}?", "Give me a few interesting facts about {t}.",
        "Tell me about {t} in a few sentences."]

FAMILIES = {
    # the instruction in the request, the IFEval instruction that checks it, its kwargs, the judge's criterion
    "lowercase": ("Your entire reply must be in lowercase letters: no capital letters at all.",
                  "change_case:english_lowercase", {},
                  "The reply must be entirely in lowercase letters, with no capital letters anywhere."),
    "french": ("Reply in French only, no other language.", "language:response_language", {"language": "fr"},
               "The reply must be written in French."),
    "short": ("Answer in fewer than 25 words.", "length_constraints:number_words",
              {"relation": "less than", "num_words": 25}, "The reply must be fewer than 25 words long."),
}


def rows(family: str, topics: list[str], seed: int, per_topic: int) -> list[dict]:
    instruction, iid, kwargs, criterion = FAMILIES[family]
    rng = random.Random(seed)
    out = []
    for topic in topics:
        for ask in rng.sample(ASKS, per_topic):
            out.append({"prompt": f"{ask.format(t=topic)} {instruction}", "instruction_id_list": [iid],
                        "kwargs": [kwargs], "criterion": criterion})
    rng.shuffle(out)
    return [{"key": i, **row} for i, row in enumerate(out)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", choices=sorted(FAMILIES), default="lowercase")
    parser.add_argument("--out", type=Path, default=Path("examples/data"))
    parser.add_argument("--held-out", type=int, default=50, help="topics kept for the test file (default: 50)")
    args = parser.parse_args(argv)
    topics = sorted(set(TOPICS))
    random.Random(0).shuffle(topics)
    test_topics, train_topics = topics[: args.held_out], topics[args.held_out:]
    args.out.mkdir(parents=True, exist_ok=True)
    for split, chosen, seed, per_topic in (("train", train_topics, 1, 2), ("test", test_topics, 2, 3)):
        path = args.out / f"judge_{args.family}_{split}.jsonl"
        data = rows(args.family, chosen, seed, per_topic)
        path.write_text("".join(json.dumps(r) + "\n" for r in data))
        print(f"{path}: {len(data)} prompts over {len(chosen)} topics")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
