"""RULER's prompt templates, answer prefixes, generation lengths and recipe constants, verbatim.

Source: NVIDIA/RULER @ c3f5e3b, scripts/data/synthetic/constants.py (templates, tokens_to_generate,
answer prefixes), scripts/data/synthetic/{niah,variable_tracking,qa}.py (needle, haystack, depths,
document prompt) and scripts/synthetic.yaml (per-task arguments).
"""
TEMPLATES = {
    'niah': {
        'tokens_to_generate': 128,
        'template': """Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. I will quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special magic {type_needle_v} for {query} mentioned in the provided text?""",
        'answer_prefix': """ The special magic {type_needle_v} for {query} mentioned in the provided text are"""
    },
    'variable_tracking': {
        'tokens_to_generate': 30,
        'template': """Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\nQuestion: Find all variables that are assigned the value {query} in the text above.""",
        'answer_prefix': """ Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are assigned the value {query}, they are: """
    },
    'common_words_extraction': {
        'tokens_to_generate': 120,
        'template': """Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones that appear most often.\n{context}\nQuestion: What are the 10 most common words in the above list?""",
        'answer_prefix': """ Answer: The top 10 words that appear most often in the list are:"""
    },
    'freq_words_extraction': {
        'tokens_to_generate': 50,
        'template': """Read the following coded text and track the frequency of each coded word. Find the three most frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore the dots '....'. What are the three most frequently appeared words in the above coded text?""",
        'answer_prefix': """ Answer: According to the coded text above, the three most frequently appeared words are:"""
    },
    'qa': {
        'tokens_to_generate': 32,
        'template': """Answer the question based on the given documents. Only give me the answer and do not output any other words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question based on the given documents. Only give me the answer and do not output any other words.\n\nQuestion: {query}""",
        'answer_prefix': """ Answer:""",
    },
}

# RULER's metric per family (scripts/eval/synthetic/constants.py).
METRIC = {
    'niah': 'string_match_all',
    'variable_tracking': 'string_match_all',
    'common_words_extraction': 'string_match_all',
    'freq_words_extraction': 'string_match_all',
    'qa': 'string_match_part',
}

NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
DOCUMENT_PROMPT = "Document {i}:\n{document}"
# np.round(np.linspace(0, 100, num=40, endpoint=True)).astype(int), as plain ints.
DEPTHS = [0, 3, 5, 8, 10, 13, 15, 18, 21, 23, 26, 28, 31, 33, 36, 38, 41, 44, 46, 49,
          51, 54, 56, 59, 62, 64, 67, 69, 72, 74, 77, 79, 82, 85, 87, 90, 92, 95, 97, 100]

# scripts/synthetic.yaml: task name -> (family, arguments).
RECIPES = {
    'niah_single_1': ('niah', dict(type_haystack='noise', type_needle_k='words', type_needle_v='numbers',
                                   num_needle_k=1, num_needle_v=1, num_needle_q=1)),
    'niah_single_2': ('niah', dict(type_haystack='essay', type_needle_k='words', type_needle_v='numbers',
                                   num_needle_k=1, num_needle_v=1, num_needle_q=1)),
    'niah_single_3': ('niah', dict(type_haystack='essay', type_needle_k='words', type_needle_v='uuids',
                                   num_needle_k=1, num_needle_v=1, num_needle_q=1)),
    'niah_multikey_1': ('niah', dict(type_haystack='essay', type_needle_k='words', type_needle_v='numbers',
                                     num_needle_k=4, num_needle_v=1, num_needle_q=1)),
    'niah_multivalue': ('niah', dict(type_haystack='essay', type_needle_k='words', type_needle_v='numbers',
                                     num_needle_k=1, num_needle_v=4, num_needle_q=1)),
    'niah_multiquery': ('niah', dict(type_haystack='essay', type_needle_k='words', type_needle_v='numbers',
                                     num_needle_k=1, num_needle_v=1, num_needle_q=4)),
    'vt': ('variable_tracking', dict(type_haystack='noise', num_chains=1, num_hops=4)),
    'cwe': ('common_words_extraction', dict(freq_cw=30, freq_ucw=3, num_cw=10)),
    'fwe': ('freq_words_extraction', dict(alpha=2.0)),
    'qa_1': ('qa', dict(dataset='squad')),
    'qa_2': ('qa', dict(dataset='hotpotqa')),
}
