"""The airline domain's 14 tools, with upstream tau2-bench semantics.

Quirks kept on purpose (the reward compares database states produced by these tools):

- the clock is fixed at 2024-05-15T15:00:00; new reservations are HATHAT, HATHAU, HATHAV and
  new certificates certificate_3221322..4, then "Too many ..." errors;
- cancelling a reservation does not release seats, and changing flights does not update seat
  counts; booking does decrement them;
- one-stop search looks for the second leg on ``2024-05-<day + 1>`` (not zero-padded) when the
  first leg arrives ``+1``;
- list arguments given as dicts are turned into records only when *every* element is a dict;
- baggage and flight updates store the given values unvalidated.
"""

from __future__ import annotations

from copy import deepcopy
from typing import Any

from . import generic
from .models import (
    AirportCode,
    CabinClass,
    Certificate,
    DirectFlight,
    Flight,
    FlightDateStatusAvailable,
    FlightDB,
    FlightInfo,
    FlightType,
    Insurance,
    Passenger,
    Payment,
    Reservation,
    ReservationFlight,
)
from .toolkit import READ, WRITE, Toolkit, tool

NOW = "2024-05-15T15:00:00"
NEW_RESERVATION_IDS = ("HATHAT", "HATHAU", "HATHAV")
NEW_PAYMENT_NUMBERS = (3221322, 3221323, 3221324)
AIRPORTS = (
    ("SFO", "San Francisco"),
    ("JFK", "New York"),
    ("LAX", "Los Angeles"),
    ("ORD", "Chicago"),
    ("DFW", "Dallas"),
    ("DEN", "Denver"),
    ("SEA", "Seattle"),
    ("ATL", "Atlanta"),
    ("MIA", "Miami"),
    ("BOS", "Boston"),
    ("PHX", "Phoenix"),
    ("IAH", "Houston"),
    ("LAS", "Las Vegas"),
    ("MCO", "Orlando"),
    ("EWR", "Newark"),
    ("CLT", "Charlotte"),
    ("MSP", "Minneapolis"),
    ("DTW", "Detroit"),
    ("PHL", "Philadelphia"),
    ("LGA", "LaGuardia"),
)
RESERVATION_ID = "The reservation ID, such as 'ZFA04Y'."
UPDATE_PAYMENT = (
    "The payment id stored in user profile, such as 'credit_card_7815826', 'gift_card_7815826', 'certificate_7815826'."
)
FLIGHTS = (
    "An array of objects containing details about each piece of flight, each "
    '{"flight_number": "HAT001", "date": "2024-05-01"}.'
)
PASSENGERS = (
    "An array of objects containing details about each passenger, each "
    '{"first_name": ..., "last_name": ..., "dob": "YYYY-MM-DD"}.'
)


def _records(values: Any, model: type) -> Any:
    """``values`` as ``model`` records when every element is a dict, otherwise unchanged (upstream)."""
    if all(isinstance(value, dict) for value in values):
        return [model(**value) for value in values]
    return values


class AirlineTools(Toolkit):
    """Tools over a :class:`FlightDB`."""

    db: FlightDB

    # ------------------------------------------------------------------ lookups

    def _get_user(self, user_id: str):
        if user_id not in self.db.users:
            raise ValueError(f"User {user_id} not found")
        return self.db.users[user_id]

    def _get_reservation(self, reservation_id: str) -> Reservation:
        if reservation_id not in self.db.reservations:
            raise ValueError(f"Reservation {reservation_id} not found")
        return self.db.reservations[reservation_id]

    def _get_flight(self, flight_number: str) -> Flight:
        if flight_number not in self.db.flights:
            raise ValueError(f"Flight {flight_number} not found")
        return self.db.flights[flight_number]

    def _get_flight_instance(self, flight_number: str, date: str):
        flight = self._get_flight(flight_number)
        if date not in flight.dates:
            raise ValueError(f"Flight {flight_number} not found on date {date}")
        return flight.dates[date]

    def _new_reservation_id(self) -> str:
        for reservation_id in NEW_RESERVATION_IDS:
            if reservation_id not in self.db.reservations:
                return reservation_id
        raise ValueError("Too many reservations")

    def _search_direct_flight(
        self, date: str, origin: str | None = None, destination: str | None = None, leave_after: str | None = None
    ) -> list[DirectFlight]:
        found = []
        for flight in self.db.flights.values():
            if (
                (origin is None or flight.origin == origin)
                and (destination is None or flight.destination == destination)
                and date in flight.dates
                and flight.dates[date].status == "available"
                and (leave_after is None or flight.scheduled_departure_time_est >= leave_after)
            ):
                day = flight.dates[date]
                found.append(
                    DirectFlight(
                        flight_number=flight.flight_number,
                        origin=flight.origin,
                        destination=flight.destination,
                        status="available",
                        scheduled_departure_time_est=flight.scheduled_departure_time_est,
                        scheduled_arrival_time_est=flight.scheduled_arrival_time_est,
                        available_seats=day.available_seats,
                        prices=day.prices,
                    )
                )
        return found

    def _payment_for_update(self, user, payment_id: str, total_price: int) -> Payment | None:
        """Charge (or, when negative, refund) ``total_price`` to a stored method; certificates refused."""
        if payment_id not in user.payment_methods:
            raise ValueError("Payment method not found")
        method = user.payment_methods[payment_id]
        if method.source == "certificate":
            raise ValueError("Certificate cannot be used to update reservation")
        if method.source == "gift_card" and method.amount < total_price:
            raise ValueError("Gift card balance is not enough")
        if method.source == "gift_card":
            method.amount -= total_price
        return Payment(payment_id=payment_id, amount=total_price) if total_price != 0 else None

    # ------------------------------------------------------------------ generic

    calculate = generic.calculate
    transfer_to_human_agents = generic.transfer_to_human_agents

    # ------------------------------------------------------------------ reads

    @tool(READ, "Get the details of a reservation.", {"reservation_id": "The reservation ID, such as '8JX2WO'."})
    def get_reservation_details(self, reservation_id: str) -> Reservation:
        return self._get_reservation(reservation_id)

    @tool(
        READ,
        "Get the details of a user, including their reservations.",
        {"user_id": "The user ID, such as 'sara_doe_496'."},
    )
    def get_user_details(self, user_id: str):
        return self._get_user(user_id)

    @tool(READ, "Returns a list of all available airports (IATA code and city).")
    def list_all_airports(self) -> list[AirportCode]:
        return [AirportCode(iata=iata, city=city) for iata, city in AIRPORTS]

    @tool(
        READ,
        "Search for direct flights between two cities on a specific date.",
        {
            "origin": "The origin city airport in three letters, such as 'JFK'.",
            "destination": "The destination city airport in three letters, such as 'LAX'.",
            "date": "The date of the flight in the format 'YYYY-MM-DD', such as '2024-01-01'.",
        },
    )
    def search_direct_flight(self, origin: str, destination: str, date: str) -> list[DirectFlight]:
        return self._search_direct_flight(date=date, origin=origin, destination=destination)

    @tool(
        READ,
        "Search for one-stop flights between two cities on a specific date. Returns a list of pairs of flights.",
        {
            "origin": "The origin city airport in three letters, such as 'JFK'.",
            "destination": "The destination city airport in three letters, such as 'LAX'.",
            "date": "The date of the flight in the format 'YYYY-MM-DD', such as '2024-05-01'.",
        },
    )
    def search_onestop_flight(self, origin: str, destination: str, date: str) -> list[list[DirectFlight]]:
        pairs = []
        for first in self._search_direct_flight(date=date, origin=origin, destination=None):
            first.date = date
            second_date = f"2024-05-{int(date[-2:]) + 1}" if "+1" in first.scheduled_arrival_time_est else date
            for second in self._search_direct_flight(
                date=second_date,
                origin=first.destination,
                destination=destination,
                leave_after=first.scheduled_arrival_time_est,
            ):
                second.date = second_date
                pairs.append([first, second])
        return pairs

    @tool(
        READ, "Get the status of a flight.", {"flight_number": "The flight number.", "date": "The date of the flight."}
    )
    def get_flight_status(self, flight_number: str, date: str) -> str:
        return self._get_flight_instance(flight_number, date).status

    # ------------------------------------------------------------------ writes

    @tool(
        WRITE,
        "Book a reservation.",
        {
            "user_id": "The ID of the user to book the reservation such as 'sara_doe_496'.",
            "origin": "The IATA code for the origin city such as 'SFO'.",
            "destination": "The IATA code for the destination city such as 'JFK'.",
            "flight_type": "The type of flight such as 'one_way' or 'round_trip'.",
            "cabin": "The cabin class such as 'basic_economy', 'economy', or 'business'.",
            "flights": FLIGHTS,
            "passengers": PASSENGERS,
            "payment_methods": "An array of objects containing details about each payment method, each "
            '{"payment_id": ..., "amount": ...}.',
            "total_baggages": "The total number of baggage items to book the reservation.",
            "nonfree_baggages": "The number of non-free baggage items to book the reservation.",
            "insurance": "Whether the reservation has insurance: 'yes' or 'no'.",
        },
    )
    def book_reservation(
        self,
        user_id: str,
        origin: str,
        destination: str,
        flight_type: FlightType,
        cabin: CabinClass,
        flights: list[FlightInfo | dict],
        passengers: list[Passenger | dict],
        payment_methods: list[Payment | dict],
        total_baggages: int,
        nonfree_baggages: int,
        insurance: Insurance,
    ) -> Reservation:
        flights = _records(flights, FlightInfo)
        passengers = _records(passengers, Passenger)
        payment_methods = _records(payment_methods, Payment)
        user = self._get_user(user_id)
        reservation_id = self._new_reservation_id()
        reservation = Reservation(
            reservation_id=reservation_id,
            user_id=user_id,
            origin=origin,
            destination=destination,
            flight_type=flight_type,
            cabin=cabin,
            flights=[],
            passengers=deepcopy(passengers),
            payment_history=deepcopy(payment_methods),
            created_at=NOW,
            total_baggages=total_baggages,
            nonfree_baggages=nonfree_baggages,
            insurance=insurance,
        )

        total_price = 0
        booked_days = []
        for info in flights:
            number = info.flight_number
            flight = self._get_flight(number)
            day = self._get_flight_instance(flight_number=number, date=info.date)
            if not isinstance(day, FlightDateStatusAvailable):
                raise ValueError(f"Flight {number} not available on date {info.date}")
            if day.available_seats[cabin] < len(passengers):
                raise ValueError(f"Not enough seats on flight {number}")
            price = day.prices[cabin]
            reservation.flights.append(
                ReservationFlight(
                    origin=flight.origin,
                    destination=flight.destination,
                    flight_number=number,
                    date=info.date,
                    price=price,
                )
            )
            booked_days.append(day)
            total_price += price * len(passengers)
        if insurance == "yes":
            total_price += 30 * len(passengers)
        total_price += 50 * nonfree_baggages

        for payment in payment_methods:
            if payment.payment_id not in user.payment_methods:
                raise ValueError(f"Payment method {payment.payment_id} not found")
            method = user.payment_methods[payment.payment_id]
            if method.source in {"gift_card", "certificate"} and method.amount < payment.amount:
                raise ValueError(f"Not enough balance in payment method {payment.payment_id}")
        paid = sum(payment.amount for payment in payment_methods)
        if paid != total_price:
            raise ValueError(f"Payment amount does not add up, total price is {total_price}, but paid {paid}")

        for payment in payment_methods:
            method = user.payment_methods[payment.payment_id]
            if method.source == "gift_card":
                method.amount -= payment.amount
            elif method.source == "certificate":
                user.payment_methods.pop(payment.payment_id)
        for day in booked_days:
            day.available_seats[cabin] -= len(passengers)
        self.db.reservations[reservation_id] = reservation
        self.db.users[user_id].reservations.append(reservation_id)
        return reservation

    @tool(WRITE, "Cancel the whole reservation.", {"reservation_id": RESERVATION_ID})
    def cancel_reservation(self, reservation_id: str) -> Reservation:
        reservation = self._get_reservation(reservation_id)
        refunds = [
            Payment(payment_id=payment.payment_id, amount=-payment.amount) for payment in reservation.payment_history
        ]
        reservation.payment_history.extend(refunds)
        reservation.status = "cancelled"
        return reservation

    @tool(
        WRITE,
        "Send a certificate to a user. Be careful!",
        {
            "user_id": "The ID of the user to send the certificate to, such as 'sara_doe_496'.",
            "amount": "The amount of the certificate to send.",
        },
    )
    def send_certificate(self, user_id: str, amount: int) -> str:
        user = self._get_user(user_id)
        for payment_id in (f"certificate_{number}" for number in NEW_PAYMENT_NUMBERS):
            if payment_id not in user.payment_methods:
                user.payment_methods[payment_id] = Certificate(id=payment_id, amount=amount, source="certificate")
                return f"Certificate {payment_id} added to user {user_id} with amount {amount}."
        raise ValueError("Too many certificates")

    @tool(
        WRITE,
        "Update the baggage information of a reservation.",
        {
            "reservation_id": RESERVATION_ID,
            "total_baggages": "The updated total number of baggage items included in the reservation.",
            "nonfree_baggages": "The updated number of non-free baggage items included in the reservation.",
            "payment_id": UPDATE_PAYMENT,
        },
    )
    def update_reservation_baggages(
        self, reservation_id: str, total_baggages: int, nonfree_baggages: int, payment_id: str
    ) -> Reservation:
        reservation = self._get_reservation(reservation_id)
        user = self._get_user(reservation.user_id)
        total_price = 50 * max(0, nonfree_baggages - reservation.nonfree_baggages)
        payment = self._payment_for_update(user, payment_id, total_price)
        if payment is not None:
            reservation.payment_history.append(payment)
        reservation.total_baggages = total_baggages
        reservation.nonfree_baggages = nonfree_baggages
        return reservation

    @tool(
        WRITE,
        "Update the flight information of a reservation.",
        {
            "reservation_id": RESERVATION_ID,
            "cabin": "The cabin class of the reservation.",
            "flights": FLIGHTS + " It lists the ENTIRE new reservation: even if a flight segment is not changed, it "
            "should still be included in the array.",
            "payment_id": UPDATE_PAYMENT,
        },
    )
    def update_reservation_flights(
        self, reservation_id: str, cabin: CabinClass, flights: list[FlightInfo | dict], payment_id: str
    ) -> Reservation:
        flights = _records(flights, FlightInfo)
        reservation = self._get_reservation(reservation_id)
        user = self._get_user(reservation.user_id)
        passengers = len(reservation.passengers)
        total_price = 0
        new_flights = []
        for info in flights:
            kept = next(
                (
                    old
                    for old in reservation.flights
                    if old.flight_number == info.flight_number and old.date == info.date and cabin == reservation.cabin
                ),
                None,
            )
            if kept:
                total_price += kept.price * passengers
                new_flights.append(kept)
                continue
            flight = self._get_flight(info.flight_number)
            day = self._get_flight_instance(flight_number=info.flight_number, date=info.date)
            if not isinstance(day, FlightDateStatusAvailable):
                raise ValueError(f"Flight {info.flight_number} not available on date {info.date}")
            if day.available_seats[cabin] < passengers:
                raise ValueError(f"Not enough seats on flight {info.flight_number}")
            leg = ReservationFlight(
                flight_number=info.flight_number,
                date=info.date,
                price=day.prices[cabin],
                origin=flight.origin,
                destination=flight.destination,
            )
            total_price += leg.price * passengers
            new_flights.append(leg)
        total_price -= sum(old.price for old in reservation.flights) * passengers
        payment = self._payment_for_update(user, payment_id, total_price)
        if payment is not None:
            reservation.payment_history.append(payment)
        reservation.flights = new_flights
        reservation.cabin = cabin
        return reservation

    @tool(
        WRITE,
        "Update the passenger information of a reservation.",
        {"reservation_id": RESERVATION_ID, "passengers": PASSENGERS},
    )
    def update_reservation_passengers(self, reservation_id: str, passengers: list[Passenger | dict]) -> Reservation:
        passengers = _records(passengers, Passenger)
        reservation = self._get_reservation(reservation_id)
        if len(passengers) != len(reservation.passengers):
            raise ValueError("Number of passengers does not match")
        reservation.passengers = deepcopy(passengers)
        return reservation
