"""The duty cycle: which training iterations are recorded (cycle), and the rate a budget
allows (budget)."""
