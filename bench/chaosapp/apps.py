from django.apps import AppConfig


class ChaosConfig(AppConfig):
    name = "bench.chaosapp"
    label = "chaosapp"
