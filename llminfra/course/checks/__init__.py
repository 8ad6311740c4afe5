"""Answer checkers, one module per chapter: ``from llminfra.course.checks import ch02``."""
