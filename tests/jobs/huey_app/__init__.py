"""A Django app whose ``tasks`` module Huey's ``run_huey`` finds (its autodiscovery)."""
