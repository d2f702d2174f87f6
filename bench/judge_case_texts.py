"""The texts of bench/judge_cases.py: the everyday prompts, a short and a long prose answer to each, the hand-written
variants the near-misses use, and the replies in other languages. Data only: the cases are built from them in
``judge_case_specs.py``.
"""

from __future__ import annotations

PROMPTS: dict[str, str] = {
    "water": "Describe the water cycle.",
    "interview": "Give me tips for a job interview.",
    "pasta": "How do I make a simple tomato pasta sauce?",
    "blackhole": "Explain what a black hole is.",
    "exercise": "What are the benefits of regular exercise?",
    "sleep": "How can I improve my sleep?",
    "ww1": "Summarize the causes of World War I.",
    "photo": "Explain how photosynthesis works.",
    "hiking": "What should I pack for a weekend hiking trip?",
    "coding": "How do I start learning to program?",
    "interest": "Explain compound interest in simple terms.",
    "bottle": "Write a short product description for a reusable water bottle.",
    "vaccine": "How do vaccines work?",
    "grocery": "How can I save money on groceries?",
    "ml": "What is machine learning?",
    "plant": "How do I keep a houseplant alive?",
    "sky": "Why is the sky blue?",
    "rainy": "Suggest some activities for a rainy day with kids.",
    "cover": "How do I write a good cover letter?",
    "paris": "Plan a one-day trip to Paris.",
    "climate": "What is the difference between weather and climate?",
}

# A short and a long prose answer to every prompt.
SHORT: dict[str, str] = {
    "water": "The water cycle is the continuous movement of water around the Earth. The sun heats oceans and lakes so "
             "water evaporates, the vapour cools and condenses into clouds, and it falls back as rain or snow.",
    "interview": "Research the company, practise answers to common questions out loud, and prepare a few stories that "
                 "show your skills. Dress one step smarter than the office norm, arrive early, and ask thoughtful "
                 "questions at the end.",
    "pasta": "Sauté a chopped onion and two cloves of garlic in olive oil, add a can of crushed tomatoes, season with "
             "salt and a pinch of sugar, and simmer for twenty minutes. Finish with fresh basil.",
    "blackhole": "A black hole is a place in space where gravity is so strong that nothing, not even light, can get "
                 "out. It forms when a very massive star collapses under its own weight.",
    "exercise": "Regular exercise strengthens your heart and lungs, helps control weight, builds muscle and bone, "
                "lifts your mood, improves sleep, and lowers the risk of diseases such as type 2 diabetes.",
    "sleep": "Keep a regular bedtime, even at weekends, avoid caffeine after lunch, keep your bedroom dark and cool, "
             "and put screens away an hour before bed.",
    "ww1": "World War I had several causes: militarism, tangled alliances, imperial rivalry and nationalism. The spark "
           "was the assassination of Archduke Franz Ferdinand in Sarajevo in June 1914.",
    "photo": "Plants use chlorophyll to capture energy from sunlight and use it to turn carbon dioxide and water into "
             "glucose, releasing oxygen into the air.",
    "hiking": "Pack layers and a rain jacket, sturdy boots, a map, a headlamp, a first-aid kit, plenty of water and "
              "snacks. If you are staying overnight, add a tent, sleeping bag and stove.",
    "coding": "Pick one language (Python is a good first choice) and work through a free beginner course. Code a "
              "little every day, then build small projects of your own.",
    "interest": "With compound interest, the interest you earn is added to your savings, and next time you earn "
                "interest on that bigger total. Over many years your money grows faster and faster.",
    "bottle": "Meet your new everyday companion: a leak-proof, double-walled steel bottle that keeps drinks cold for "
              "24 hours and hot for 12. Light, tough and plastic-free.",
    "vaccine": "A vaccine shows your immune system a harmless version or piece of a germ. Your body makes antibodies "
               "and memory cells, so it can fight off the real infection quickly later.",
    "grocery": "Plan meals before you shop, write a list and stick to it, buy store brands, compare unit prices, and "
               "cook in batches so less food goes to waste.",
    "ml": "Machine learning is a branch of artificial intelligence in which computers learn patterns from data instead "
          "of following hand-written rules, and then use those patterns to make predictions.",
    "plant": "Give it the right amount of light for its type, water only when the top of the soil is dry, use a pot "
             "with drainage holes, and feed it lightly during spring and summer.",
    "sky": "The sky is blue because air molecules scatter short, blue wavelengths of sunlight much more than longer "
           "red ones, so blue light reaches our eyes from every direction.",
    "rainy": "Build a blanket fort, bake cookies together, set up an indoor treasure hunt, put on a puppet show, or do "
             "a craft project with paper, glue and whatever you find in the recycling.",
    "cover": "Tailor it to the job, open with why you want this role, highlight two or three achievements with "
             "numbers, and keep it to one page with a confident, friendly close.",
    "paris": "Start at the Eiffel Tower early, walk along the Seine to the Louvre, have lunch in the Marais, visit "
             "Notre-Dame and the Latin Quarter, and end with sunset at Montmartre.",
    "climate": "Weather is the state of the atmosphere over hours or days, like today's rain. Climate is the "
               "long-term average of weather in a region, usually measured over thirty years.",
}

LONG: dict[str, str] = {
    "water": (
        "The water cycle describes how water moves continuously between the oceans, the atmosphere and the land. It "
        "starts with evaporation: the sun warms the surface of oceans, lakes and rivers, and some of that water turns "
        "into vapour and rises. Plants add more vapour through transpiration, releasing water from their leaves. As "
        "the warm, moist air rises it cools, and the vapour condenses around tiny particles of dust to form clouds. "
        "When the droplets in a cloud grow heavy enough, they fall as precipitation: rain, snow, sleet or hail. Some "
        "of that water soaks into the ground and becomes groundwater, some runs off into streams and rivers, and some "
        "is stored for years in glaciers and ice caps. Eventually most of it flows back to the sea, and the cycle "
        "begins again. The whole process is driven by energy from the sun and by gravity, and it is what keeps fresh "
        "water available to living things."),
    "interview": (
        "A job interview goes much better with a bit of preparation. First, research the company: read its website, "
        "recent news and the job description, and note how your experience matches what they need. Second, prepare "
        "stories. Most interviewers ask behavioural questions such as \"Tell me about a time you handled a "
        "conflict\", so have four or five examples ready and tell them using the STAR method: situation, task, "
        "action, result. Practise out loud, ideally with a friend, until the answers feel natural rather than "
        "memorised. On the day, plan your route, arrive ten minutes early, and bring copies of your CV. During the "
        "interview, listen carefully, take a moment before answering, and be honest about what you don't know. At "
        "the end, ask two or three real questions about the team or the role. Afterwards, send a short thank-you "
        "email within a day."),
    "pasta": (
        "Here is an easy tomato sauce that takes about thirty minutes. Warm three tablespoons of olive oil in a pan "
        "over medium heat. Add one finely chopped onion and cook it for about eight minutes, until soft and "
        "translucent but not brown. Stir in two or three sliced garlic cloves and cook for one more minute. Pour in a "
        "400 g can of whole peeled tomatoes, crushing them with a wooden spoon, and add a good pinch of salt. If the "
        "tomatoes taste sharp, add a small pinch of sugar. Let the sauce simmer gently, uncovered, for 20 to 25 "
        "minutes, stirring now and then, until it thickens. Taste, adjust the salt, and tear in a handful of fresh "
        "basil. Toss it with freshly cooked pasta and a splash of the pasta water, and serve with grated Parmesan."),
    "blackhole": (
        "A black hole is a region of space where matter is packed so densely that its gravity prevents anything from "
        "escaping, including light. The boundary of that region is called the event horizon: once something crosses "
        "it, there is no way back out. Most black holes form when a star many times heavier than the Sun runs out of "
        "nuclear fuel. Without the outward pressure from fusion, the core collapses under its own gravity, often in a "
        "supernova explosion. There are also supermassive black holes, millions or billions of times the mass of the "
        "Sun, which sit at the centres of most large galaxies, including our own Milky Way. We cannot see black holes "
        "directly, but we can detect them from the way they pull on nearby stars, from the hot, glowing gas that "
        "swirls around them, and from the gravitational waves produced when two of them merge. In 2019 the Event "
        "Horizon Telescope even produced the first image of the shadow of a black hole."),
    "exercise": (
        "Regular exercise has benefits for almost every part of the body. It strengthens the heart and improves "
        "circulation, which lowers blood pressure and the risk of heart disease and stroke. It helps you maintain a "
        "healthy weight and improves how your body handles blood sugar, reducing the risk of type 2 diabetes. "
        "Weight-bearing and strength exercises build muscle and keep bones dense, which matters more and more as we "
        "age. Exercise is also good for the mind: it releases endorphins, reduces stress and symptoms of anxiety and "
        "depression, and is linked to better memory and concentration. Many people find they sleep more deeply when "
        "they are active during the day. Even modest amounts help: around 150 minutes of brisk walking a week is "
        "enough to see real improvements."),
    "sleep": (
        "Better sleep usually comes from a few consistent habits rather than one trick. Go to bed and get up at the "
        "same time every day, including weekends, so your body clock stays steady. Get some daylight in the morning, "
        "which helps set that clock. Cut off caffeine by early afternoon and go easy on alcohol, which makes sleep "
        "lighter in the second half of the night. Keep your bedroom cool, dark and quiet, and reserve your bed for "
        "sleep so your brain associates it with rest. In the last hour before bed, dim the lights, put your phone "
        "away and do something calming, like reading or a warm shower. If you can't fall asleep after twenty "
        "minutes, get up and do something quiet until you feel sleepy. If poor sleep lasts for weeks, talk to a "
        "doctor."),
    "ww1": (
        "Historians usually group the causes of World War I under four headings. Militarism: the great powers, "
        "especially Germany and Britain, were in an arms race, and their generals had detailed plans for rapid "
        "mobilisation. Alliances: Europe was split into two blocs, the Triple Entente of France, Russia and Britain "
        "and the Triple Alliance of Germany, Austria-Hungary and Italy, so a local conflict could quickly draw "
        "everyone in. Imperialism: competition for colonies and markets bred suspicion and rivalry. Nationalism: "
        "national pride ran high, and Slavic nationalism in the Balkans threatened Austria-Hungary. The immediate "
        "trigger came on 28 June 1914, when a Bosnian Serb, Gavrilo Princip, assassinated Archduke Franz Ferdinand in "
        "Sarajevo. Austria-Hungary declared war on Serbia, Russia mobilised to support Serbia, Germany declared war "
        "on Russia and France, and Britain entered after Germany invaded Belgium."),
    "photo": (
        "Photosynthesis is the process plants, algae and some bacteria use to turn light into chemical energy. It "
        "takes place mainly in the leaves, inside structures called chloroplasts, which contain the green pigment "
        "chlorophyll. It has two stages. In the light-dependent reactions, chlorophyll absorbs sunlight and uses that "
        "energy to split water molecules. This releases oxygen as a by-product and produces two energy carriers, ATP "
        "and NADPH. In the second stage, the Calvin cycle, the plant uses the ATP and NADPH to take carbon dioxide "
        "from the air and build it into glucose. The plant then uses that glucose for energy or turns it into starch "
        "and cellulose. The overall reaction is: six molecules of carbon dioxide plus six of water, with light, give "
        "one molecule of glucose and six of oxygen."),
    "hiking": (
        "Packing for a weekend hike is easier with a checklist. Start with the ten essentials: navigation (map, "
        "compass or a phone with offline maps), a headlamp, sun protection, a first-aid kit, a knife, a fire starter, "
        "an emergency shelter, extra food, extra water and extra clothes. For clothing, think in layers: a base layer "
        "that wicks sweat, an insulating fleece or puffy, and a waterproof shell. Cotton stays wet, so avoid it. Wear "
        "boots or trail shoes you have already broken in, and pack a spare pair of socks. If you are camping "
        "overnight, you will also need a tent, a sleeping bag rated for the expected temperatures, a sleeping pad, a "
        "small stove with fuel, and a pot. Finally, check the weather forecast before you leave and tell someone "
        "your route and when you expect to be back."),
    "coding": (
        "The best way to start programming is to pick one language and stick with it for a few months. Python is a "
        "popular first choice because its syntax is readable and it is used for everything from websites to data "
        "analysis. Begin with a structured resource, such as a free online course or a beginner book, so you learn "
        "the fundamentals in order: variables, conditions, loops, functions and basic data structures. Type out the "
        "examples yourself instead of just reading them, and do the exercises. After a few weeks, start a small "
        "project that interests you, such as a to-do list, a quiz game or a script that renames your photos. You "
        "will get stuck often; that is normal. Learning to read error messages and search for answers is a core "
        "skill. Finally, read other people's code and share yours, because feedback speeds up learning enormously."),
    "interest": (
        "Compound interest is interest calculated on both the money you originally put in and the interest that has "
        "already been added. Imagine you deposit $1,000 in an account that pays 5% a year. After the first year you "
        "earn $50, so you have $1,050. In the second year you earn 5% of $1,050, which is $52.50, not just $50. The "
        "extra $2.50 is interest earned on your interest. That difference looks tiny at first, but it grows every "
        "year: after 10 years you would have about $1,629, and after 30 years about $4,322, without adding anything. "
        "This is why starting to save early matters so much. The same effect works against you with debt: on a "
        "credit card, unpaid interest is added to the balance, and you then pay interest on it."),
    "bottle": (
        "Stay refreshed wherever the day takes you with the TrailFlow bottle. Its double-wall vacuum insulation keeps "
        "water ice-cold for 24 hours and coffee hot for 12, while the outside stays dry and comfortable to hold. It "
        "is made from food-grade stainless steel, so it never holds on to old flavours, and it is completely free of "
        "BPA. The leak-proof lid has a carry loop and a wide mouth that fits ice cubes and is easy to clean. At 750 "
        "ml it holds enough for a long hike or a full workday yet still slips into most cup holders and backpack "
        "pockets. Every bottle you use can replace hundreds of single-use plastic ones each year. Available in six "
        "colours, with a lifetime warranty."),
    "vaccine": (
        "Vaccines work by giving your immune system a safe preview of a germ so it is ready if it ever meets the real "
        "thing. A vaccine contains an antigen, something that looks like part of the virus or bacterium, such as an "
        "inactivated virus, a single protein, or mRNA instructions that let your own cells make that protein for a "
        "short time. Your immune system treats the antigen as an intruder. B cells produce antibodies that stick to "
        "it, and T cells learn to recognise infected cells. Crucially, some of these cells become long-lived memory "
        "cells. If you are later exposed to the actual germ, the memory cells recognise it and the response is much "
        "faster and stronger, often stopping the infection before you feel ill. When enough people in a community "
        "are vaccinated, the germ struggles to spread, which also protects people who cannot be vaccinated."),
    "grocery": (
        "There are lots of small ways to cut your grocery bill that add up quickly. Start with a weekly meal plan "
        "built around what is already in your fridge and cupboards, then write a shopping list from it. Look at the "
        "supermarket's flyer or app before you go and plan a few meals around what is on sale. In the store, compare "
        "the price per kilogram or per litre on the shelf label, because bigger packs are not always cheaper. "
        "Store-brand products are usually much cheaper than big names and often taste the same. Buy seasonal "
        "produce, and do not overlook the frozen aisle; frozen vegetables and fruit are nutritious and never go off. "
        "Cook larger portions and freeze the leftovers for lunches. Finally, keep track of what you throw away: "
        "wasted food is wasted money."),
    "ml": (
        "Machine learning is a way of building software that learns from examples instead of being programmed with "
        "explicit rules. Say you want a program that spots spam emails. Writing rules by hand is hard, because "
        "spammers keep changing their tactics. With machine learning, you collect thousands of emails labelled "
        "\"spam\" or \"not spam\" and give them to an algorithm, which adjusts the parameters of a model until it can "
        "tell the two apart. The trained model can then classify new emails it has never seen. This is called "
        "supervised learning. There is also unsupervised learning, where the algorithm finds structure in unlabelled "
        "data, such as groups of similar customers, and reinforcement learning, where an agent learns by trial and "
        "error from rewards. Machine learning powers recommendations, voice assistants, translation, fraud detection "
        "and the chatbots you may already be using."),
    "plant": (
        "Most houseplants die from too much care rather than too little, usually overwatering. Before you do "
        "anything, find out what your plant is and what it needs. Light comes first: a succulent wants bright, "
        "direct sun, while a peace lily or a snake plant is happy a few metres from a window. To water, push a finger "
        "into the soil; if the top two or three centimetres are dry, water thoroughly until it drains from the "
        "bottom, then empty the saucer. If it is still damp, wait. Always use a pot with drainage holes. Most plants "
        "like normal room temperatures and dislike cold draughts and radiators. In spring and summer, feed every few "
        "weeks with a half-strength liquid fertiliser, and skip feeding in winter when growth slows. Yellow, mushy "
        "leaves usually mean too much water; crispy brown tips often mean dry air or too little."),
    "sky": (
        "Sunlight looks white, but it is a mixture of all the colours of the rainbow, each with a different "
        "wavelength. When that light enters the atmosphere, it collides with the nitrogen and oxygen molecules in "
        "the air. These molecules are much smaller than the wavelength of light, and they scatter short wavelengths "
        "far more strongly than long ones, an effect called Rayleigh scattering. Blue light has a short wavelength, "
        "so it gets scattered all over the sky, and when you look up, blue light reaches your eyes from every "
        "direction. Violet is scattered even more, but the sun emits less of it and our eyes are less sensitive to "
        "it, so the sky looks blue rather than purple. At sunset, light travels through much more air, most of the "
        "blue is scattered away before it reaches you, and the reds and oranges remain."),
    "rainy": (
        "A rainy day can still be a lot of fun. Here are some ideas that work for a range of ages. Build a fort out "
        "of blankets, chairs and cushions, then have a picnic or read stories inside it with a torch. Bake something "
        "simple together, such as muffins or pizza, and let the kids measure and decorate. Set up a treasure hunt "
        "with clues hidden around the house. Make a craft: paper plate masks, painted stones or a cardboard box "
        "turned into a car or a rocket. Put on a show, whether it is a puppet show, a dance performance or a play "
        "they write themselves. Play board games or card games, or have an indoor obstacle course with pillows and "
        "tape lines on the floor. And if everyone is getting restless, put on raincoats and wellies and go jump in "
        "some puddles."),
    "cover": (
        "A strong cover letter tells the hiring manager something your CV cannot: why you want this particular job "
        "and why you would be good at it. Address it to a named person if you can find one. In the opening "
        "paragraph, say which role you are applying for and give a specific, genuine reason it appeals to you; "
        "mention something about the company's work, not just its reputation. The middle paragraph or two should "
        "connect your experience to the requirements in the job advert. Choose a couple of achievements and be "
        "concrete: \"I reduced customer response times by 30%\" is far more persuasive than \"I am a hard worker\". "
        "Keep it to a single page, avoid repeating your CV line by line, and use the same keywords the advert uses. "
        "Close by thanking them and saying you would be glad to discuss the role further. Proofread it twice."),
    "paris": (
        "Here is a relaxed but full day in Paris. Morning: start early at the Eiffel Tower to beat the queues, then "
        "walk across the river to the Trocadéro for the classic photo. Take the metro to the Louvre and spend two or "
        "three hours there; pick a few highlights, such as the Mona Lisa, the Winged Victory and the Egyptian rooms, "
        "rather than trying to see everything. Lunch: walk through the Tuileries Garden and on to the Marais for "
        "falafel on Rue des Rosiers or lunch at a café. Afternoon: cross to the Île de la Cité to see Notre-Dame and "
        "the Sainte-Chapelle, then wander the Latin Quarter and the bookstalls along the Seine. Evening: head up to "
        "Montmartre for sunset over the city from the steps of Sacré-Cœur, and have dinner in one of the small "
        "bistros nearby."),
    "climate": (
        "Weather and climate describe the same things (temperature, rain, wind and humidity) but over very different "
        "timescales. Weather is what is happening in the atmosphere at a particular place and time: a hot afternoon, "
        "a storm tonight, snow at the weekend. It changes from hour to hour and is hard to predict more than about "
        "ten days ahead. Climate is the average pattern of weather in a region over a long period, typically thirty "
        "years or more, including how much it usually varies. For example, the climate of London is mild and wet, "
        "even though any given week there can be dry or cold. A helpful way to remember it: climate is what you "
        "expect, weather is what you get. This is also why one cold winter does not disprove global warming, which "
        "is a change in the long-term climate."),
}

# Replies of an exact word count (asserted below), for the word-limit near-misses: (prompt, words, reply).
EXACT: dict[str, tuple[str, int, str]] = {
    "w20": ("interview", 20, "Arrive ten minutes early, research the company, prepare two questions of your own, and "
                             "answer with examples from past work."),
    "w21": ("sky", 21, "Sunlight is scattered by gas molecules in the air. Blue light scatters more than red light, so "
                       "the sky looks blue."),
    "w30": ("photo", 30, "Photosynthesis is how plants make food. Chlorophyll in the leaves captures sunlight, which "
                         "powers a reaction that turns carbon dioxide and water into glucose and releases oxygen as a "
                         "by-product."),
    "w31": ("interest", 31, "Compound interest means earning interest on your interest. Each year the interest is "
                            "added to your balance, so next year's interest is calculated on a bigger amount and "
                            "growth speeds up."),
    "w49": ("coding", 49, "Start with one beginner-friendly language such as Python and follow a structured course, so "
                          "you know what comes next. Write a little code every day, even briefly. Once the basics "
                          "click, build a small project you care about, like a budget tracker, because finishing "
                          "something real teaches you most."),
    "w50": ("blackhole", 50, "A black hole is a region of space where gravity is so strong that nothing, not even "
                             "light, can escape once it crosses the event horizon. Most form when a massive star runs "
                             "out of fuel and collapses. Astronomers find them by watching how they pull on stars and "
                             "gas."),
    "w51": ("climate", 51, "Weather is what the atmosphere is doing right now or over the next few days: a sunny "
                           "afternoon or a thunderstorm. Climate is the average pattern of weather in a place over "
                           "decades, usually over thirty years. Weather tells you what to wear today; climate tells "
                           "you what clothes to own."),
    "w79": ("vaccine", 79, "Vaccines train your immune system without making you sick. They contain a harmless piece "
                           "or weakened version of a germ, or instructions for your cells to make one of its proteins. "
                           "Your immune system reacts to it by producing antibodies and memory cells. If you later "
                           "meet the real germ, those memory cells recognise it right away and mount a fast, strong "
                           "response, so the infection is stopped or stays mild. That is also why some vaccines need "
                           "boosters."),
    "w80": ("plant", 80, "To keep a houseplant alive, start by learning what kind of light it likes and put it in the "
                         "right spot. Water only when the top few centimetres of soil are dry, and always use a pot "
                         "with a drainage hole so the roots never sit in water. Feed it with a diluted fertiliser in "
                         "spring and summer, gently wipe the dust off the leaves now and then, and repot it when roots "
                         "start circling the bottom of the pot."),
    "w99": ("cover", 99, "A good cover letter is short, specific and written for one job. Open by naming the role and "
                         "giving a one-line reason you are excited about it. In the next paragraph, pick two or three "
                         "achievements that match the job description and describe them with numbers where you can, "
                         "for example how much time or money you saved. Show that you understand what the company "
                         "does and why you want to work there. Keep the tone confident but not stiff, stay under one "
                         "page, and end by thanking the reader and saying you would welcome the chance to talk."),
    "w100": ("hiking", 100, "For a weekend hike, pack in layers. Bring a moisture-wicking base layer, a warm fleece, "
                            "and a waterproof jacket, even if it looks sunny. Wear broken-in hiking boots and pack "
                            "spare socks. You will need a map or offline GPS, a headlamp with extra batteries, a small "
                            "first-aid kit, sunscreen and a hat. Carry two litres of water per person per day, plus a "
                            "filter or purification tablets if you will refill from streams. For food, pack easy "
                            "calories like nuts, dried fruit, wraps and a simple dinner. If you are camping, add a "
                            "tent, sleeping bag, pad and stove."),
    "w101": ("grocery", 101, "Saving money on groceries is mostly about planning. Before you shop, check what you "
                             "already have, plan the week's meals around it, and write a list you actually stick to. "
                             "Shop with a full stomach so you are less tempted by snacks. Compare unit prices on the "
                             "shelf labels rather than package prices, and try store brands, often made in the same "
                             "factories. Buy staples like rice, oats and beans in bulk, choose fruit and vegetables "
                             "that are in season, and use frozen vegetables, which are cheap and keep for months. "
                             "Finally, cook larger batches and freeze leftovers for busy nights."),
}

# A follow-up question an assistant might close each answer with.
FOLLOW_UP: dict[str, str] = {
    "water": "Would you like a simple diagram of the cycle to go with this?",
    "interview": "Do you want me to run a quick mock interview with you?",
    "pasta": "Would you like a variation with cream or chilli?",
    "blackhole": "Shall I explain what happens to time near the event horizon?",
    "exercise": "What kind of exercise do you enjoy most?",
    "sleep": "How many hours are you sleeping at the moment?",
    "ww1": "Would you like a timeline of the July Crisis?",
    "photo": "Would it help to see the chemical equation written out step by step?",
    "hiking": "Where are you hiking, and what weather is forecast?",
    "coding": "What kind of things would you like to build?",
    "interest": "Do you want me to work through an example with your own numbers?",
    "bottle": "Should I also write a shorter version for a social media post?",
    "vaccine": "Is there a particular vaccine you are curious about?",
    "grocery": "How many people are you shopping for each week?",
    "ml": "Would you like an example of training a simple model in Python?",
    "plant": "What kind of plant do you have?",
    "sky": "Want to know why sunsets are red, too?",
    "rainy": "How old are your kids?",
    "cover": "Would you like me to look over a draft of yours?",
    "paris": "Do you want restaurant suggestions for each stop?",
    "climate": "Would you like some examples of different climate zones?",
}

# Hand-written variants used by the keyword and forbidden-word near-misses.
RAINFALL = ("Water evaporates from oceans and lakes when the sun heats them, rises as vapour, and cools high in the "
            "atmosphere until it condenses into clouds. When the droplets grow heavy they return to the ground as "
            "rainfall or snow. Raindrops that soak into the soil refill groundwater, the rest runs into rivers and "
            "back to the sea, and the cycle starts over.")
PLANNING = ("Careful planning is the biggest saver. Check your fridge before you go out, decide the week's dinners in "
            "advance, and only buy what those meals need. Store brands, seasonal vegetables and the reduced-price "
            "shelf near closing time all help, and batch-cooking on Sundays means fewer expensive takeaways.")
VERY_REPLY = ("Very good question! The easiest way to improve your sleep is to keep the same schedule every day, "
              "even on weekends. Keep the bedroom cool and dark, skip coffee after midday, and give yourself half an "
              "hour without screens before bed.")
VERY_INSIDE = ("Exercise pays off everywhere: your heart gets stronger, you sleep more deeply, and everyday tasks like "
               "climbing stairs or carrying shopping get easier. Most people also notice that their mood is more "
               "even, and over the years every session lowers the risk of diabetes, heart disease and some cancers.")
ACCELERATE = ("Think of compound interest as a snowball rolling downhill. At first it is small, but each year the "
              "interest joins the pile and earns interest too, so the growth starts to accelerate. Money you leave "
              "alone for thirty years can end up several times larger than what you put in.")
PASSIONATE = ("Open with a sentence about why this specific role excites you, and be honest: saying you are "
              "passionate about everything reads as filler. Then give two concrete achievements that match the job "
              "advert, show you know what the company does, and finish with a polite line inviting them to talk.")
REALLY_REPLY = ("Honestly, the thing that really matters is practice. Do mock interviews with a friend, prepare short "
                "stories about your achievements, and read up on the company so you can ask a good question or two "
                "at the end.")


_LANG_TEXT: dict[str, tuple[str, str]] = {  # name: (prompt key, reply)
    "fr_water": ("water", "Le cycle de l'eau est le mouvement continu de l'eau sur la Terre. Le soleil chauffe les "
                          "océans, l'eau s'évapore, la vapeur se refroidit et forme des nuages, puis elle retombe sous "
                          "forme de pluie ou de neige."),
    "fr_interview": ("interview", "Pour réussir un entretien d'embauche, renseignez-vous d'abord sur l'entreprise et "
                                  "sur le poste. Préparez quelques exemples concrets de vos réussites et "
                                  "entraînez-vous à les raconter à voix haute. Le jour J, arrivez dix minutes en "
                                  "avance, écoutez bien les questions et n'hésitez pas à prendre une seconde avant de "
                                  "répondre. À la fin, posez deux ou trois questions sur l'équipe : cela montre votre "
                                  "intérêt. Et n'oubliez pas d'apporter quelques copies de votre CV."),
    "fr_pasta": ("pasta", "Faites revenir un oignon émincé dans trois cuillères d'huile d'olive pendant huit minutes, "
                          "puis ajoutez deux gousses d'ail. Versez une boîte de tomates pelées, écrasez-les à la "
                          "cuillère, salez et laissez mijoter vingt minutes à feu doux. Terminez avec quelques "
                          "feuilles de basilic frais."),
    "fr_sleep": ("sleep", "Couchez-vous et levez-vous à heure fixe, même le week-end. Évitez le café après le "
                          "déjeuner, gardez votre chambre fraîche et sombre, et rangez votre téléphone une heure avant "
                          "de dormir."),
    "fr_paris": ("paris", "Commencez la journée tôt à la tour Eiffel, puis marchez le long de la Seine jusqu'au "
                          "Louvre. Déjeunez dans le Marais, visitez Notre-Dame et flânez dans le Quartier latin "
                          "l'après-midi. Le soir, montez à Montmartre pour admirer le coucher du soleil depuis le "
                          "Sacré-Cœur."),
    "fr_cover": ("cover", "Pour une bonne lettre de motivation, misez sur le storytelling : expliquez pourquoi ce "
                          "poste vous motive, citez deux ou trois réussites chiffrées et gardez un ton simple. Le "
                          "networking sur LinkedIn peut aussi vous aider à décrocher un entretien."),
    "es_exercise": ("exercise", "El ejercicio regular fortalece el corazón y los pulmones, ayuda a mantener un peso "
                                "saludable y mejora el estado de ánimo. También reduce el riesgo de diabetes y de "
                                "enfermedades cardíacas, y ayuda a dormir mejor. Con caminar a paso ligero unos "
                                "treinta minutos al día ya se notan los beneficios."),
    "es_grocery": ("grocery", "Planifica las comidas de la semana antes de ir al supermercado y haz una lista. "
                              "Compara el precio por kilo, elige marcas blancas y compra frutas y verduras de "
                              "temporada. Cocina en cantidad y congela las sobras para no desperdiciar comida."),
    "es_sky": ("sky", "El cielo es azul porque las moléculas del aire dispersan la luz azul del sol mucho más que la "
                      "luz roja. Este fenómeno se llama dispersión de Rayleigh, y por eso la luz azul nos llega desde "
                      "todas las direcciones."),
    "es_rainy": ("rainy", "Construyan un fuerte con mantas y cojines, preparen galletas juntos, organicen una "
                          "búsqueda del tesoro por la casa o hagan manualidades con cartón y pintura. Y si hace falta "
                          "moverse, pónganse las botas de agua y salgan a saltar en los charcos."),
    "de_photo": ("photo", "Bei der Fotosynthese nutzen Pflanzen das Sonnenlicht, um aus Kohlendioxid und Wasser "
                          "Traubenzucker herzustellen. Das grüne Chlorophyll in den Blättern fängt die Lichtenergie "
                          "ein, und als Nebenprodukt wird Sauerstoff an die Luft abgegeben."),
    "de_hiking": ("hiking", "Für eine Wanderung am Wochenende brauchst du feste Wanderschuhe, eine Regenjacke, warme "
                            "Kleidung im Zwiebelprinzip, eine Karte, eine Stirnlampe und ein kleines Erste-Hilfe-Set. "
                            "Nimm genug Wasser und Snacks mit. Wenn du zeltest, kommen Zelt, Schlafsack, Isomatte und "
                            "Kocher dazu."),
    "de_coding": ("coding", "Such dir eine Programmiersprache aus, zum Beispiel Python, und arbeite einen kostenlosen "
                            "Einsteigerkurs durch. Schreib jeden Tag ein bisschen Code, und sobald du die Grundlagen "
                            "kannst, bau ein kleines eigenes Projekt, das dich wirklich interessiert."),
    "de_ml": ("ml", "Maschinelles Lernen ist ein Teilgebiet der künstlichen Intelligenz. Statt feste Regeln zu "
                    "programmieren, gibt man dem Computer viele Beispiele, und ein Algorithmus lernt daraus Muster, "
                    "mit denen er Vorhersagen für neue Daten treffen kann."),
    "en_fr_greeting": ("water", "Bonjour ! Here is a quick summary. The water cycle is the constant movement of water "
                                "between the oceans, the sky and the land: water evaporates, forms clouds, falls as "
                                "rain or snow and flows back to the sea. Merci !"),
    "en_es_signoff": ("exercise", "Regular exercise keeps your heart and lungs strong, helps you manage your weight, "
                                  "and improves your mood and sleep. Even a brisk thirty-minute walk most days makes a "
                                  "real difference. ¡Buena suerte y a moverse!"),
}

