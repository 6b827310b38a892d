"""The game day: an operator-driven run with a blast radius and live state (``mlchaos gameday``)."""
