from django.apps import AppConfig


class BenchConfig(AppConfig):
    name = "bench.benchapp"
    label = "benchapp"
