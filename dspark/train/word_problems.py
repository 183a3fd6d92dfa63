"""Grade-school word problems made from templates: the math pools of the default target's recipe."""

from __future__ import annotations

from dataclasses import dataclass

from dspark.runtime.prompts import load_prompts


def load_math_prompts(limit: int | None = None, *, seed: int = 0, series: int = 1) -> list[str]:
    """Grade-school word problems made from templates, worded as the math evaluation's (GSM8K) questions are.

    The ShareGPT pool holds few multi-step arithmetic questions, and no training split of GSM8K ships in a
    PyPI package. These are generated instead, each template filled with random names, objects and small round
    numbers. Only the questions matter: the target answers them, and its answers are what a drafter learns.
    Three series of problem shapes, kept apart so that a corpus answered from one stays valid when another
    is added:

    - ``series=1``: 25 shapes (rates, fractions, percentages, change, ages, averages, ...), 4,000 prompts.
    - ``series=2``: 25 other shapes (profit, unit conversion, ratios, schedules, overtime, fuel, series that
      grow day by day, ...), 2,000 prompts.
    - ``series=3``: 25 shapes neither earlier series uses (areas, bus passengers, family tickets, commission,
      shared fares, paint, parking, eggs by the carton, ...), 2,000 prompts.

    Deduplicated, in the order ``seed`` draws them (so a limit keeps a prefix), never an evaluation prompt.
    """
    import random

    if series not in _MATH_SERIES:
        raise ValueError(f"series must be one of {sorted(_MATH_SERIES)}, got {series!r}")
    shapes, size = _MATH_SERIES[series]
    rng = random.Random(seed)
    held_out = {p.text for p in load_prompts("math")}
    seen, prompts = set(), []
    while len(prompts) < size:
        template = rng.choice(shapes)
        prompt = template(rng, *rng.sample(_PEOPLE, 3))
        if prompt not in seen and prompt not in held_out:
            seen.add(prompt)
            prompts.append(prompt)
    return prompts[:limit]


@dataclass(frozen=True)
class _Person:
    name: str
    he: str
    him: str
    his: str

    @property
    def He(self) -> str:  # noqa: N802 - a sentence's first word
        return self.he.capitalize()

    @property
    def His(self) -> str:  # noqa: N802
        return self.his.capitalize()


_PEOPLE = [_Person(n, "she", "her", "her") for n in (
    "Natalia", "Maria", "Emma", "Aisha", "Mei", "Sofia", "Olivia", "Priya", "Hannah", "Zoe", "Fatima", "Lucy",
    "Grace", "Chloe", "Yuki", "Amara", "Isabel", "Nora", "Leila", "Rosa")] + \
    [_Person(n, "he", "him", "his") for n in (
        "James", "Carlos", "Ahmed", "Liam", "Kenji", "Noah", "Ravi", "Ethan", "Mateo", "Samuel", "Omar", "Lucas",
        "Daniel", "Tom", "Wei", "Kwame", "Jack", "Ivan", "Diego", "Ben")]
_ITEMS = ("apples", "pencils", "stickers", "marbles", "cookies", "books", "stamps", "cupcakes", "seashells",
          "toy cars", "bracelets", "muffins", "postcards", "candles", "balloons", "notebooks")
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December")


def _sold_twice(rng, a, b, c):
    n = rng.randrange(4, 60, 2)
    more = rng.choice(["half as many", "twice as many", f"{rng.randint(3, 15)} more"])
    m = rng.randrange(11)
    return (f"{a.name} sold {n} {rng.choice(_ITEMS)} in {_MONTHS[m]}, and then {a.he} sold {more} in "
            f"{_MONTHS[(m + 1) % 12]}. How many did {a.name} sell altogether in {_MONTHS[m]} and "
            f"{_MONTHS[(m + 1) % 12]}?")


def _hourly_pay(rng, a, b, c):
    job = rng.choice(["babysitting", "tutoring", "walking dogs", "mowing lawns", "washing cars"])
    return (f"{a.name} earns ${rng.randint(6, 30)} an hour for {job}. Yesterday, {a.he} worked "
            f"{rng.choice([30, 45, 90, 120, 150, 180])} minutes. How much did {a.he} earn?")


def _saving_up(rng, a, b, c):
    price = rng.randrange(60, 400, 10)
    gift = rng.randrange(5, price // 6, 5)
    thing = rng.choice(["bike", "wallet", "guitar", "tablet", "pair of skates", "backpack"])
    return (f"{a.name} is saving money for a new {thing} which costs ${price}. {a.He} has only half of the money "
            f"{a.he} needs. {a.His} parents decided to give {a.him} ${gift} for that purpose, and {a.his} "
            f"grandparents twice as much as {a.his} parents. How much more money does {a.name} need to buy the "
            f"{thing}?")


def _reading(rng, a, b, c):
    first = rng.randint(8, 30)
    pages = 3 * first + 2 * rng.randint(20, 150)  # an even number of pages left, so half is whole
    return (f"{a.name} is reading a {pages}-page book. Yesterday, {a.he} was able to read {first} pages and today, "
            f"{a.he} read twice as many pages as yesterday. If {a.he} wants to read half of the remaining pages "
            f"tomorrow, how many pages should {a.he} read?")


def _discount(rng, a, b, c):
    item = rng.choice(["shirts", "mugs", "board games", "lamps", "plant pots", "scarves"])
    return (f"A store sells {item} for ${rng.randrange(10, 80, 5) * 2} each. During a sale, every one is "
            f"{rng.choice([10, 20, 25, 50])}% off. {a.name} buys {rng.randint(2, 9)} {item}. How much does {a.he} "
            f"pay?")


def _two_legs(rng, a, b, c):
    return (f"{a.name} drives at {rng.randrange(30, 70, 5)} miles per hour for {rng.randint(2, 5)} hours, then at "
            f"{rng.randrange(40, 80, 5)} miles per hour for {rng.randint(1, 4)} hours. How many miles did {a.he} "
            f"drive in total?")


def _ages(rng, a, b, c):
    years = rng.randint(2, 10)
    later = rng.randint(years + 3, years + 20)
    return (f"{a.name} is {rng.randint(2, 4)} times as old as {b.name}. In {years} years, {b.name} will be "
            f"{later} years old. How old is {a.name} now?")


def _recipe(rng, a, b, c):
    dish, ingredient = rng.choice([("pancakes", "flour"), ("cookies", "sugar"), ("muffins", "milk"),
                                   ("loaves of bread", "water")])
    n = rng.choice([4, 6, 8, 12])
    return (f"A recipe for {n} {dish} needs {rng.randint(1, 4)} cups of {ingredient}. {a.name} wants to make "
            f"{n * rng.randint(2, 6)} {dish}. How many cups of {ingredient} does {a.he} need?")


def _weekly_runs(rng, a, b, c):
    activity = rng.choice([("runs", "miles"), ("swims", "laps"), ("cycles", "kilometers"), ("walks", "miles")])
    return (f"{a.name} {activity[0]} {rng.randint(2, 8)} {activity[1]} every weekday and {rng.randint(3, 12)} "
            f"{activity[1]} on each day of the weekend. How many {activity[1]} does {a.he} cover in "
            f"{rng.randint(2, 6)} weeks?")


def _giving_away(rng, a, b, c):
    n = rng.randrange(24, 240, 12)
    return (f"{a.name} has {n} {rng.choice(_ITEMS)}. {a.He} gives a third of them to {b.name} and a quarter of "
            f"them to {c.name}. How many does {a.name} have left?")


def _fence(rng, a, b, c):
    place = rng.choice(["garden", "yard", "playground", "dog run", "vegetable patch"])
    length = rng.randint(8, 60)
    return (f"A rectangular {place} is {length} feet long and {rng.randint(5, length)} feet wide. "
            f"{a.name} wants to put a fence around it. Fencing costs ${rng.randint(2, 15)} per foot. How much "
            f"will the fence cost?")


def _growth(rng, a, b, c):
    place = rng.choice(["bakery", "coffee shop", "library", "bookstore", "swimming pool"])
    return (f"Last year, a {place} had {rng.randrange(40, 400, 20)} visitors a day. This year the number went up "
            f"by {rng.choice([5, 10, 15, 20, 25, 50])}%. How many visitors a day does it have now?")


def _change(rng, a, b, c):
    n1, p1, n2, p2 = rng.randint(2, 6), rng.randint(1, 9), rng.randint(2, 5), rng.randint(3, 15)
    bill = next(x for x in (20, 50, 100, 200) if x > n1 * p1 + n2 * p2)
    first, second = rng.sample(["notebooks", "pens", "apples", "sandwiches", "juice boxes", "erasers",
                                "magazines"], 2)
    return (f"{a.name} buys {n1} {first} at ${p1} each and {n2} {second} at ${p2} each. {a.He} pays with a "
            f"${bill} bill. How much change does {a.he} get?")


def _class(rng, a, b, c):
    n = rng.randrange(20, 41, 4)
    girls = rng.choice([25, 50, 75])
    sport = rng.choice(["soccer", "basketball", "chess", "tennis"])
    boys = n - n * girls // 100
    return (f"There are {n} students in {a.name}'s class. {girls}% of them are girls. Of the boys, "
            f"{rng.randint(1, boys)} play {sport}. How many boys do not play {sport}?")


def _practice(rng, a, b, c):
    instrument = rng.choice(["piano", "violin", "guitar", "drums", "flute"])
    return (f"{a.name} practises the {instrument} for {rng.choice([15, 20, 30, 40, 45, 60, 90])} minutes a day. "
            f"How many hours does {a.he} practise in {rng.choice([6, 12, 14, 21, 30])} days?")


def _legs(rng, a, b, c):
    first, second = rng.sample([("chickens", 2), ("cows", 4), ("ducks", 2), ("goats", 4), ("pigs", 4),
                                ("sheep", 4)], 2)
    return (f"{a.name}'s farm has {rng.randint(3, 40)} {first[0]} and {rng.randint(2, 25)} {second[0]}. How many "
            f"legs do the animals have in all?")


def _factory(rng, a, b, c):
    return (f"A factory makes {rng.randrange(20, 500, 10)} {rng.choice(_ITEMS)} an hour. It runs "
            f"{rng.randint(6, 16)} hours a day, {rng.randint(4, 7)} days a week. How many does it make in a week?")


def _tank(rng, a, b, c):
    rate = rng.randint(2, 12)
    volume = rate * rng.randrange(8, 80, 4)
    return (f"A tank holds {volume} liters of water. A pipe fills it at {rate} liters per minute. If the tank is "
            f"already a quarter full, how many minutes will it take to fill it?")


def _tip(rng, a, b, c):
    return (f"{a.name} ordered dinner for ${rng.randrange(20, 120, 4)}. {a.He} left a {rng.choice([10, 15, 20, 25])}% "
            f"tip. How much did {a.he} pay in total?")


def _collection(rng, a, b, c):
    thing = rng.choice(["stamps", "coins", "trading cards", "comic books", "rocks"])
    return (f"{a.name} has {rng.randint(10, 200)} {thing}. Every month {a.he} buys {rng.randint(2, 12)} more, and "
            f"every {rng.choice([2, 3, 4, 6])} months {a.he} gives {rng.randint(1, 8)} away. How many {thing} does "
            f"{a.he} have after a year?")


def _compare_three(rng, a, b, c):
    items = rng.choice(_ITEMS)
    return (f"{a.name} has {rng.randint(2, 20)} more {items} than {b.name}. {b.name} has {rng.randint(2, 5)} times "
            f"as many {items} as {c.name}. If {c.name} has {rng.randint(3, 25)} {items}, how many {items} do the "
            f"three of them have together?")


def _average(rng, a, b, c):
    scores = [rng.randint(60, 98) for _ in range(3)]
    goal = rng.randint(max(70, (sum(scores) + 40) // 4 + 1), min(95, (sum(scores) + 100) // 4))
    return (f"{a.name} scored {scores[0]}, {scores[1]} and {scores[2]} on {a.his} first three tests. What score "
            f"does {a.he} need on the fourth test to have an average of {goal}?")


def _fundraiser(rng, a, b, c):
    tickets, price, gift = rng.randrange(20, 200, 10), rng.randint(2, 12), rng.randrange(50, 500, 25)
    cost = tickets * price + gift + rng.randrange(50, 1000, 50)
    return (f"{a.name}'s school is raising money for a trip. They sell {tickets} tickets at ${price} each and get "
            f"a donation of ${gift}. The trip costs ${cost}. How much more money do they need?")


def _pizza(rng, a, b, c):
    slices = rng.choice([6, 8, 10, 12])
    friends = rng.choice([k for k in range(2, 12) if (slices * 6) % (k + 1) == 0])
    pizzas = rng.choice([p for p in range(2, 8) if (p * slices) % (friends + 1) == 0])
    return (f"{a.name} orders {pizzas} pizzas, each cut into {slices} slices. {a.He} and {friends} friends share "
            f"them equally. How many slices does each person get?")


def _work_rate(rng, a, b, c):
    task, thing = rng.choice([("paint", "fence post"), ("fold", "paper crane"), ("bake", "tray of cookies"),
                              ("knit", "scarf"), ("wash", "car")])
    minutes = rng.choice([3, 4, 5, 6, 10, 12, 15, 20])
    return (f"It takes {a.name} {minutes} minutes to {task} one {thing}. How many can {a.he} {task} in "
            f"{rng.randint(1, 5)} hours?")


_WORD_PROBLEMS = (_sold_twice, _hourly_pay, _saving_up, _reading, _discount, _two_legs, _ages, _recipe, _weekly_runs,
                  _giving_away, _fence, _growth, _change, _class, _practice, _legs, _factory, _tank, _tip,
                  _collection, _compare_three, _average, _fundraiser, _pizza, _work_rate)


def _resale(rng, a, b, c):
    n, cost = rng.randrange(10, 60, 5), rng.randint(2, 20)
    return (f"{a.name} buys {n} {rng.choice(_ITEMS)} for ${cost} each and sells them at a craft fair for "
            f"${cost + rng.randint(1, 9)} each. {a.He} pays ${rng.randrange(10, 60, 5)} for the stall. If {a.he} sells "
            f"all of them, how much profit does {a.he} make?")


def _ribbon(rng, a, b, c):
    piece = rng.choice([3, 4, 6, 8, 9, 12])
    feet = piece * rng.randint(1, 5)  # a whole number of pieces
    return (f"{a.name} has a ribbon {feet} feet long. {a.He} cuts it into pieces that are {piece} inches long. "
            f"How many pieces does {a.he} get?")


def _school_day(rng, a, b, c):
    start, lesson, lessons, lunch = rng.choice([7, 8, 9]), rng.choice([40, 45, 50, 55]), rng.randint(4, 7), \
        rng.choice([20, 30, 45, 60])
    return (f"{a.name}'s school day starts at {start}:00 a.m. {a.He} has {lessons} lessons of {lesson} minutes each, "
            f"a {lunch}-minute lunch break and a 15-minute recess. At what time does {a.his} school day end?")


def _allowance(rng, a, b, c):
    money = rng.randrange(12, 120, 12)
    return (f"{a.name} gets ${money} a month for pocket money. {a.He} spends a third of it on snacks and a quarter "
            f"of it on bus fares, and saves the rest. How much does {a.he} save in {rng.randint(2, 12)} months?")


def _ratio(rng, a, b, c):
    x, y = rng.sample(range(1, 8), 2)
    group = rng.choice([("boys", "girls", "club"), ("red", "blue", "box of marbles"),
                        ("cats", "dogs", "animal shelter"), ("adults", "children", "swimming class")])
    return (f"In a {group[2]}, the ratio of {group[0]} to {group[1]} is {x}:{y}. There are "
            f"{(x + y) * rng.randint(3, 20)} in total. How many {group[1]} are there?")


def _meeting_trains(rng, a, b, c):
    v1, v2, hours = rng.randrange(40, 90, 5), rng.randrange(40, 90, 5), rng.randint(2, 6)
    return (f"Two trains leave two cities {(v1 + v2) * hours} miles apart at the same time and travel toward each "
            f"other. One goes {v1} miles per hour and the other {v2} miles per hour. How many hours pass before "
            f"they meet?")


def _tiles(rng, a, b, c):
    room = rng.choice(["kitchen", "bathroom", "living room", "hallway", "bedroom"])
    return (f"{a.name}'s {room} is {rng.randint(6, 20)} feet long and {rng.randint(5, 15)} feet wide. Tiles cost "
            f"${rng.randint(2, 9)} per square foot, and the installer charges ${rng.randrange(100, 600, 50)}. How "
            f"much does it cost to tile the floor?")


def _seedlings(rng, a, b, c):
    rows, per_row = rng.randint(4, 20), rng.randrange(5, 30, 5)
    return (f"{a.name} plants {rows} rows of tomato seedlings with {per_row} seedlings in each row. "
            f"{rng.choice([10, 20, 25, 40, 50])}% of the seedlings do not survive. How many seedlings survive?")


def _phone_plan(rng, a, b, c):
    return (f"{a.name}'s phone plan costs ${rng.randint(15, 45)} a month and includes {rng.randint(2, 10)} GB of data. "
            f"Every extra GB costs ${rng.randint(2, 15)}. Last month {a.he} used "
            f"{rng.randint(11, 20)} GB. How much was {a.his} bill?")


def _packs(rng, a, b, c):
    pack = rng.choice([4, 6, 8, 10, 12, 24])
    guests = rng.randint(15, 90)
    thing = rng.choice(["juice boxes", "party hats", "cupcakes", "water bottles", "paper plates"])
    return (f"{a.name} needs {guests} {thing} for a party. They come in packs of {pack}, and a pack costs "
            f"${rng.randint(3, 12)}. How much will {a.he} spend?")


def _sale_then_rise(rng, a, b, c):
    price = rng.randrange(40, 400, 20)
    return (f"A jacket costs ${price}. The store lowers the price by {rng.choice([10, 20, 25, 50])}%, and a month "
            f"later raises the new price by {rng.choice([10, 20, 50])}%. What is the price of the jacket now?")


def _growing_habit(rng, a, b, c):
    start, more, days = rng.randint(5, 30), rng.randint(2, 10), rng.randint(4, 8)
    habit = rng.choice([("reads", "pages"), ("does", "push-ups"), ("writes", "lines of poetry"), ("runs", "laps")])
    return (f"On Monday {a.name} {habit[0]} {start} {habit[1]}. Each day after that {a.he} {habit[0]} {more} more "
            f"{habit[1]} than the day before. How many {habit[1]} does {a.he} do in {days} days altogether?")


def _doubling(rng, a, b, c):
    thing = rng.choice([("bacteria", "a dish", "every hour", "hours"), ("followers", "a new account", "every week",
                        "weeks"), ("lily pads", "a pond", "every day", "days")])
    return (f"The number of {thing[0]} in {thing[1]} doubles {thing[2]}. There are {rng.randint(3, 50)} now. How many "
            f"will there be after {rng.randint(3, 7)} {thing[3]}?")


def _fuel(rng, a, b, c):
    mpg = rng.randrange(20, 45, 5)
    return (f"{a.name}'s car goes {mpg} miles on a gallon of gas, and gas costs ${rng.randint(3, 5)} a gallon. How "
            f"much does gas cost for a trip of {mpg * rng.randint(4, 20)} miles there and the same distance back?")


def _overtime(rng, a, b, c):
    rate = rng.randrange(10, 40, 2)
    return (f"{a.name} earns ${rate} an hour for the first 40 hours of a week, and one and a half times that for "
            f"every hour over 40. This week {a.he} worked {rng.randint(42, 60)} hours. How much did {a.he} earn?")


def _leftover(rng, a, b, c):
    kids = rng.randint(3, 12)
    return (f"{a.name} baked {rng.randint(3, 8)} trays of {rng.choice(['cookies', 'brownies', 'muffins'])} with "
            f"{rng.choice([12, 16, 20, 24])} on each tray. {a.He} shares them equally among {kids} children and "
            f"keeps the ones left over. How many does {a.he} keep?")


def _truck(rng, a, b, c):
    box = rng.randrange(20, 80, 5)
    return (f"A delivery truck can carry {box * rng.randint(20, 60) + rng.randrange(0, box, 5)} pounds. The driver "
            f"weighs {rng.randrange(150, 250, 10)} pounds and each box weighs {box} pounds. How many boxes can the "
            f"truck carry with the driver in it?")


def _temperature(rng, a, b, c):
    return (f"At 6 a.m. the temperature was {rng.randint(-10, 15)} degrees. It rose {rng.randint(2, 5)} degrees "
            f"every hour until noon, then fell {rng.randint(1, 4)} degrees every hour until 8 p.m. What was the "
            f"temperature at 8 p.m.?")


def _ages_sum(rng, a, b, c):
    age = rng.randint(4, 15)
    gap = rng.randint(2, 9)
    return (f"{a.name} is {age} years old. {b.name} is {gap} years older than {a.name}, and {c.name} is twice as old "
            f"as {b.name}. What will the sum of their ages be in {rng.randint(2, 10)} years?")


def _weeks_to_goal(rng, a, b, c):
    weekly = rng.randint(5, 40)
    have = rng.randrange(0, 100, 10)
    return (f"{a.name} wants a {rng.choice(['telescope', 'video game console', 'camera', 'keyboard', 'drone'])} "
            f"that costs ${have + weekly * rng.randint(4, 30)}. {a.He} has ${have} and saves ${weekly} every week. "
            f"How many weeks will it take {a.him} to have enough?")


def _rental(rng, a, b, c):
    thing = rng.choice(["bike", "kayak", "paddle board", "scooter", "rowing boat"])
    return (f"Renting a {thing} costs ${rng.randint(8, 25)} for the first hour and ${rng.randint(3, 10)} for each "
            f"hour after that. {a.name} and {b.name} each rent one for {rng.randint(2, 8)} hours. How much do they "
            f"pay together?")


def _pace(rng, a, b, c):
    pace, miles = rng.choice([8, 9, 10, 11, 12]), rng.choice([3, 5, 6, 10, 13])
    return (f"{a.name} runs a mile in {pace} minutes. If {a.he} starts a {miles}-mile run at "
            f"{rng.randint(6, 9)}:00 a.m., at what time does {a.he} finish?")


def _library(rng, a, b, c):
    return (f"A school library has {rng.randrange(300, 3000, 50)} books. On Monday {rng.randint(20, 90)} books are "
            f"borrowed, on Tuesday {rng.randint(10, 60)} are returned, and on Wednesday {rng.randint(20, 90)} more are "
            f"borrowed and {rng.randint(10, 40)} returned. How many books are in the library now?")


def _coins(rng, a, b, c):
    return (f"{a.name} has {rng.randint(3, 40)} quarters, {rng.randint(3, 40)} dimes and {rng.randint(3, 40)} "
            f"nickels in {a.his} piggy bank. How much money does {a.he} have in dollars?")


def _journey(rng, a, b, c):
    total = rng.choice([12, 18, 24, 30, 36, 48, 60])
    return (f"{a.name} travels {total} miles to visit {b.name}. {a.He} walks a sixth of the way, takes a bus for half "
            f"of what is left, and rides a bike the rest of the way. How many miles does {a.he} ride the bike?")


_WORD_PROBLEMS_2 = (_resale, _ribbon, _school_day, _allowance, _ratio, _meeting_trains, _tiles, _seedlings, _phone_plan,
                    _packs, _sale_then_rise, _growing_habit, _doubling, _fuel, _overtime, _leftover, _truck,
                    _temperature, _ages_sum, _weeks_to_goal, _rental, _pace, _library, _coins, _journey)


def _planting_area(rng, a, b, c):
    length, width = rng.randrange(20, 80, 2), rng.randrange(10, 50, 2)
    return (f"{a.name}'s backyard is a rectangle {length} feet long and {width} feet wide. A square shed "
            f"{rng.randrange(4, min(length, width) // 2, 2)} feet on each side stands in one corner. How many square "
            f"feet of the yard are left for planting?")


def _bus_stops(rng, a, b, c):
    start = rng.randrange(20, 60, 2)
    off = rng.randint(3, start // 2)
    on = rng.randrange(2 + (start - off) % 2, 16, 2)  # an even number aboard, so that half of them is whole
    return (f"A bus leaves the station with {start} passengers. At the first stop {off} people get off and {on} get "
            f"on. At the second stop half of the passengers get off and {rng.randint(1, 9)} get on. How many "
            f"passengers are on the bus now?")


def _sharing_out(rng, a, b, c):
    n = 12 * rng.randint(3, 15)
    thing = rng.choice(_ITEMS)
    return (f"{a.name} has {n} {thing}. {a.He} gives a quarter of them to {b.name} and gives {c.name} "
            f"{rng.randint(2, 6)} more than {b.name} got. How many {thing} does {a.name} have left?")


def _family_tickets(rng, a, b, c):
    adult = rng.randrange(8, 40, 2)
    return (f"Tickets to the {rng.choice(['zoo', 'aquarium', 'science museum', 'water park', 'planetarium'])} cost "
            f"${adult} for an adult and half as much for a child. {a.name} takes {a.his} partner and "
            f"{rng.randint(2, 5)} children, and pays ${rng.randint(5, 20)} for parking. How much does the day cost?")


def _bakery_dozens(rng, a, b, c):
    dozens = rng.randrange(6, 32, 2)  # even, so that every share below is a whole number of rolls
    return (f"A bakery bakes {dozens} dozen rolls every morning. By noon it has sold {rng.choice([25, 50, 75])}% of "
            f"them, and in the afternoon it sells half of what is left. How many rolls are left at closing time?")


def _bookshelf(rng, a, b, c):
    shelves, per_shelf = rng.randint(3, 9), rng.randrange(20, 50, 5)
    return (f"{a.name}'s bookcase has {shelves} shelves, and each shelf holds {per_shelf} books. {a.He} already has "
            f"{rng.randint(10, shelves * per_shelf - 10)} books on it. How many more books can {a.he} fit?")


def _water_glasses(rng, a, b, c):
    return (f"{a.name} drinks {rng.randint(4, 10)} glasses of water a day, and each glass holds "
            f"{rng.choice([200, 250, 300, 400, 500])} milliliters. How many liters of water does {a.he} drink in "
            f"{rng.choice(['a week', 'two weeks', 'a 30-day month'])}?")


def _commission(rng, a, b, c):
    return (f"{a.name} sells cars. {a.He} earns ${rng.randrange(1000, 3000, 100)} a month plus "
            f"{rng.choice([2, 3, 4, 5, 10])}% of everything {a.he} sells. Last month {a.he} sold "
            f"${rng.randrange(20000, 200000, 5000)} worth of cars. How much did {a.he} earn last month?")


def _shared_taxi(rng, a, b, c):
    return (f"A taxi charges ${rng.randint(2, 6)} to start and ${rng.randint(1, 4)} for every mile. {a.name}, "
            f"{b.name} and {c.name} ride {rng.randint(4, 30)} miles together and split the fare equally. How much does "
            f"each of them pay?")


def _stamp_album(rng, a, b, c):
    pages, per_page = rng.randrange(20, 80, 4), rng.randrange(8, 30, 2)
    return (f"{a.name}'s stamp album has {pages} pages, and each page holds {per_page} stamps. The album is "
            f"{rng.choice(['one quarter', 'half', 'three quarters'])} full. How many more stamps can {a.he} put in it?")


def _every_fourth_free(rng, a, b, c):
    thing = rng.choice(["T-shirts", "notebooks", "candles", "plants", "mugs"])
    return (f"A shop sells {thing} for ${rng.randint(4, 25)} each, and every fourth one is free. {a.name} takes "
            f"{4 * rng.randint(2, 8)} {thing} to the counter. How much does {a.he} pay?")


def _paint_cans(rng, a, b, c):
    side, height = rng.randrange(8, 20), rng.choice([8, 9, 10])
    return (f"{a.name} paints the four walls of a square room that is {side} feet on each side and {height} feet "
            f"high. One can of paint covers {rng.choice([50, 100, 150, 200])} square feet. How many cans does {a.he} "
            f"need for two coats?")


def _basketball(rng, a, b, c):
    return (f"In a basketball game {a.name} scored {rng.randint(2, 9)} two-point shots, {rng.randint(1, 6)} "
            f"three-point shots and {rng.randint(1, 8)} free throws worth one point each. {b.name} scored twice as "
            f"many points as {a.name}. How many points did they score together?")


def _aquarium(rng, a, b, c):
    goldfish = rng.randint(3, 15)
    return (f"{a.name}'s aquarium has {goldfish} goldfish and {rng.choice(['twice', 'three times'])} as many "
            f"guppies. Every week {a.he} adds {rng.randint(2, 6)} more guppies. How many fish are in the aquarium "
            f"after {rng.randint(2, 8)} weeks?")


def _cinema_seats(rng, a, b, c):
    rows, seats = rng.choice([10, 20, 30]), rng.randrange(10, 30, 2)  # every percentage below is whole seats
    return (f"A cinema has {rows} rows with {seats} seats in each row. For the evening show "
            f"{rng.choice([25, 50, 75, 80, 90])}% of the seats were sold. How many seats were empty?")


def _bus_trip(rng, a, b, c):
    return (f"{a.name}'s bus leaves at {rng.randint(7, 11)}:{rng.choice(['00', '15', '30', '45'])} a.m. It drives "
            f"{rng.randrange(60, 300, 30)} miles at {rng.choice([30, 60])} miles per hour and makes "
            f"{rng.randint(2, 5)} stops of {rng.choice([10, 15, 20])} minutes each. At what time does it arrive?")


def _lemonade(rng, a, b, c):
    cups = rng.randrange(10, 60, 2)
    return (f"{a.name} sells lemonade for ${rng.randint(1, 3)} a cup, and each cup costs {a.him} "
            f"{rng.choice([25, 40, 50])} cents to make. {a.He} sells {cups} cups on Saturday and twice as many on "
            f"Sunday. How much profit does {a.he} make over the weekend?")


def _stairs(rng, a, b, c):
    return (f"{a.name} lives on the {rng.choice(['third', 'fourth', 'fifth', 'sixth'])} floor, and each flight of "
            f"stairs has {rng.randint(10, 20)} steps. {a.He} walks up to {a.his} apartment {rng.randint(2, 4)} times "
            f"a day. How many steps does {a.he} climb in a week?")


def _group_gift(rng, a, b, c):
    friends = rng.randint(3, 8)
    return (f"{friends} friends buy a birthday present for {a.name} that costs ${friends * rng.randint(5, 30)} and a "
            f"card that costs ${friends * rng.randint(1, 3)}. They split the cost equally. How much does each friend "
            f"pay?")


def _crate_weight(rng, a, b, c):
    return (f"A crate holds {rng.choice([12, 16, 24, 32, 48])} cans, and each can weighs "
            f"{rng.choice([8, 12, 16])} ounces. A store receives {rng.randint(3, 20)} crates. How many pounds do the "
            f"cans weigh altogether?")


def _screen_time(rng, a, b, c):
    return (f"{a.name} practices the {rng.choice(['violin', 'piano', 'flute', 'drums'])} for "
            f"{rng.choice([15, 20, 30, 40])} minutes on each weekday and {rng.choice([45, 60, 90])} minutes on each "
            f"day of the weekend. How many hours does {a.he} practice in {rng.randint(2, 6)} weeks?")


def _parking(rng, a, b, c):
    hours = rng.randint(3, 8)
    return (f"Parking downtown costs ${rng.randint(2, 6)} for the first hour and ${rng.randint(1, 3)} for every half "
            f"hour after that. {a.name} parks from 9:00 a.m. until {hours}:30 p.m. How much does {a.he} pay?")


def _egg_cartons(rng, a, b, c):
    hens = rng.randrange(12, 60, 12)  # a whole number of cartons
    return (f"{a.name} keeps {hens} hens, and each hen lays {rng.choice([4, 5, 6])} eggs a week. {a.He} packs the "
            f"eggs in cartons of {rng.choice([6, 12])} and sells each carton for ${rng.randint(2, 6)}. How much "
            f"money does {a.he} make in a week?")


def _town(rng, a, b, c):
    people = rng.randrange(1000, 20000, 100)
    return (f"A town had {people} people. Then {rng.choice([5, 10, 20])}% of them moved away, and "
            f"{rng.randint(10, 90)} families of {rng.randint(3, 5)} moved in. How many people live in the town now?")


def _hike(rng, a, b, c):
    speed = rng.choice([2, 3, 4])
    return (f"{a.name} hikes up a trail {speed * rng.randint(2, 6)} miles long at {speed} miles per hour and comes "
            f"back down the same way twice as fast. How many hours does the whole hike take?")


_WORD_PROBLEMS_3 = (_planting_area, _bus_stops, _sharing_out, _family_tickets, _bakery_dozens, _bookshelf,
                    _water_glasses, _commission, _shared_taxi, _stamp_album, _every_fourth_free, _paint_cans,
                    _basketball, _aquarium, _cinema_seats, _bus_trip, _lemonade, _stairs, _group_gift, _crate_weight,
                    _screen_time, _parking, _egg_cartons, _town, _hike)
# Each series' shapes and how many prompts it holds.
_MATH_SERIES = {1: (_WORD_PROBLEMS, 4000), 2: (_WORD_PROBLEMS_2, 2000), 3: (_WORD_PROBLEMS_3, 2000)}
