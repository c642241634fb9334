"""Airline tools on real records: a success and each documented refusal, with upstream's texts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from taubench_support import domain, needs_data  # noqa: E402

pytestmark = needs_data


@pytest.fixture(scope="module")
def shared():
    """One environment for the read-only checks (building the 7 MB database takes ~0.1 s)."""
    return domain("airline").environment()


@pytest.fixture
def env():
    return domain("airline").environment()


def call(env, name, **arguments):
    result = env.call(name, arguments)
    return (
        result.content if result.error else json.loads(result.content) if result.content[:1] in "{[" else result.content
    )


def open_day(env, cabin="economy", seats=1, exclude=()):
    """A flight and date open for booking with ``seats`` free in ``cabin``."""
    for flight in env.tools.db.flights.values():
        for day, status in flight.dates.items():
            if (
                status.status == "available"
                and status.available_seats[cabin] >= seats
                and flight.flight_number not in exclude
            ):
                return flight, day, status
    raise LookupError


def user_with(env, source, minimum=0.0):
    return next(
        u
        for u in env.tools.db.users.values()
        if any(m.source == source and getattr(m, "amount", 0) >= minimum for m in u.payment_methods.values())
    )


def method(user, source):
    return next(m for m in user.payment_methods.values() if m.source == source)


def test_reads(shared):
    reservation = next(iter(shared.tools.db.reservations.values()))
    out = call(shared, "get_reservation_details", reservation_id=reservation.reservation_id)
    assert list(out) == [
        "reservation_id",
        "user_id",
        "origin",
        "destination",
        "flight_type",
        "cabin",
        "flights",
        "passengers",
        "payment_history",
        "created_at",
        "total_baggages",
        "nonfree_baggages",
        "insurance",
        "status",
    ]
    assert call(shared, "get_reservation_details", reservation_id="ZZZZZZ") == "Error: Reservation ZZZZZZ not found"
    assert call(shared, "get_user_details", user_id=reservation.user_id)["user_id"] == reservation.user_id
    assert call(shared, "get_user_details", user_id="nobody") == "Error: User nobody not found"
    airports = call(shared, "list_all_airports")
    assert len(airports) == 20 and airports[0] == {"iata": "SFO", "city": "San Francisco"}
    flight, day, _ = open_day(shared)
    found = call(shared, "search_direct_flight", origin=flight.origin, destination=flight.destination, date=day)
    assert flight.flight_number in {f["flight_number"] for f in found}
    assert all(f["status"] == "available" and f["date"] is None for f in found)
    assert call(shared, "get_flight_status", flight_number=flight.flight_number, date=day) == "available"
    assert call(shared, "get_flight_status", flight_number="HAT999", date=day) == "Error: Flight HAT999 not found"
    assert (
        call(shared, "get_flight_status", flight_number=flight.flight_number, date="2030-01-01")
        == f"Error: Flight {flight.flight_number} not found on date 2030-01-01"
    )


def test_onestop_search_pairs_connecting_flights(shared):
    pairs = call(shared, "search_onestop_flight", origin="JFK", destination="SEA", date="2024-05-20")
    assert pairs, "JFK to SEA has connections on 2024-05-20"
    for first, second in pairs:
        assert first["origin"] == "JFK" and second["destination"] == "SEA"
        assert first["destination"] == second["origin"] and first["date"] == "2024-05-20"
        assert second["scheduled_departure_time_est"] >= first["scheduled_arrival_time_est"]


def test_book_reservation_charges_and_decrements_seats(env):
    user = user_with(env, "gift_card")
    gift = method(user, "gift_card")
    flight, day, status = open_day(env, "economy", 2)
    seats, price = status.available_seats["economy"], status.prices["economy"]
    passengers = [
        {"first_name": "Ann", "last_name": "Lee", "dob": "1990-01-01"},
        {"first_name": "Bo", "last_name": "Lee", "dob": "1992-02-02"},
    ]
    total = 2 * price + 2 * 30 + 50
    booking = dict(
        user_id=user.user_id,
        origin=flight.origin,
        destination=flight.destination,
        flight_type="one_way",
        cabin="economy",
        flights=[{"flight_number": flight.flight_number, "date": day}],
        passengers=passengers,
        total_baggages=1,
        nonfree_baggages=1,
        insurance="yes",
    )
    gift.amount = total - 5
    assert (
        call(env, "book_reservation", **booking, payment_methods=[{"payment_id": gift.id, "amount": total}])
        == f"Error: Not enough balance in payment method {gift.id}"
    )
    gift.amount = total
    assert (
        call(env, "book_reservation", **booking, payment_methods=[{"payment_id": gift.id, "amount": total - 1}])
        == f"Error: Payment amount does not add up, total price is {total}, but paid {total - 1}"
    )
    assert (
        call(env, "book_reservation", **booking, payment_methods=[{"payment_id": "gift_card_0", "amount": total}])
        == "Error: Payment method gift_card_0 not found"
    )
    before = gift.amount
    out = call(env, "book_reservation", **booking, payment_methods=[{"payment_id": gift.id, "amount": total}])
    assert out["reservation_id"] == "HATHAT" and out["created_at"] == "2024-05-15T15:00:00"
    assert out["flights"] == [
        {
            "flight_number": flight.flight_number,
            "origin": flight.origin,
            "destination": flight.destination,
            "date": day,
            "price": price,
        }
    ]
    assert gift.amount == before - total
    assert status.available_seats["economy"] == seats - 2
    assert env.tools.db.users[user.user_id].reservations[-1] == "HATHAT"
    # Three new ids per episode, then refusal (payment checks come after the id is chosen).
    for expected in ("HATHAU", "HATHAV"):
        gift.amount = total
        assert (
            call(env, "book_reservation", **booking, payment_methods=[{"payment_id": gift.id, "amount": total}])[
                "reservation_id"
            ]
            == expected
        )
    assert call(env, "book_reservation", **booking, payment_methods=[]) == "Error: Too many reservations"


def test_book_reservation_refusals(env):
    user = user_with(env, "credit_card")
    card = method(user, "credit_card")
    flight, day, status = open_day(env)
    base = dict(
        user_id=user.user_id,
        origin=flight.origin,
        destination=flight.destination,
        flight_type="one_way",
        cabin="economy",
        passengers=[{"first_name": "A", "last_name": "B", "dob": "1990-01-01"}],
        payment_methods=[{"payment_id": card.id, "amount": 1}],
        total_baggages=0,
        nonfree_baggages=0,
        insurance="no",
    )
    assert (
        call(
            env,
            "book_reservation",
            **{**base, "user_id": "nobody"},
            flights=[{"flight_number": flight.flight_number, "date": day}],
        )
        == "Error: User nobody not found"
    )
    landed = next((f, d) for f in env.tools.db.flights.values() for d, s in f.dates.items() if s.status == "landed")
    assert (
        call(env, "book_reservation", **base, flights=[{"flight_number": landed[0].flight_number, "date": landed[1]}])
        == f"Error: Flight {landed[0].flight_number} not available on date {landed[1]}"
    )
    status.available_seats["economy"] = 0
    assert (
        call(env, "book_reservation", **base, flights=[{"flight_number": flight.flight_number, "date": day}])
        == f"Error: Not enough seats on flight {flight.flight_number}"
    )
    bad = call(
        env,
        "book_reservation",
        **{**base, "cabin": "first"},
        flights=[{"flight_number": flight.flight_number, "date": day}],
    )
    assert bad.startswith(
        "Error: 1 validation error for Reservation\ncabin\n  Input should be 'business', 'economy' or 'basic_economy'"
    )


def test_certificates_cannot_pay_updates_and_send_certificate_stops_at_three(env):
    user = next(
        u
        for u in env.tools.db.users.values()
        if not any(m.startswith("certificate_322132") for m in u.payment_methods) and u.reservations
    )
    for number in (3221322, 3221323, 3221324):
        assert (
            call(env, "send_certificate", user_id=user.user_id, amount=100)
            == f"Certificate certificate_{number} added to user {user.user_id} with amount 100."
        )
    assert call(env, "send_certificate", user_id=user.user_id, amount=100) == "Error: Too many certificates"
    assert user.payment_methods["certificate_3221322"].amount == 100.0  # stored as a float, as upstream
    reservation = env.tools.db.reservations[user.reservations[0]]
    assert (
        call(
            env,
            "update_reservation_baggages",
            reservation_id=reservation.reservation_id,
            total_baggages=reservation.total_baggages + 1,
            nonfree_baggages=reservation.nonfree_baggages + 1,
            payment_id="certificate_3221322",
        )
        == "Error: Certificate cannot be used to update reservation"
    )
    assert call(env, "send_certificate", user_id="nobody", amount=1) == "Error: User nobody not found"


def test_update_baggages_charges_50_per_extra_paid_bag(env):
    reservation = next(
        r
        for r in env.tools.db.reservations.values()
        if r.status is None
        and any(m.source == "gift_card" for m in env.tools.db.users[r.user_id].payment_methods.values())
    )
    user = env.tools.db.users[reservation.user_id]
    gift = method(user, "gift_card")
    update = dict(
        reservation_id=reservation.reservation_id,
        total_baggages=reservation.total_baggages + 2,
        nonfree_baggages=reservation.nonfree_baggages + 2,
    )
    assert (
        call(env, "update_reservation_baggages", **update, payment_id="credit_card_0")
        == "Error: Payment method not found"
    )
    gift.amount = 99.0
    assert (
        call(env, "update_reservation_baggages", **update, payment_id=gift.id)
        == "Error: Gift card balance is not enough"
    )
    gift.amount = 100.0
    out = call(env, "update_reservation_baggages", **update, payment_id=gift.id)
    assert out["payment_history"][-1] == {"payment_id": gift.id, "amount": 100} and gift.amount == 0.0
    # Fewer paid bags cost nothing and record no payment.
    out = call(
        env,
        "update_reservation_baggages",
        reservation_id=reservation.reservation_id,
        total_baggages=0,
        nonfree_baggages=0,
        payment_id=gift.id,
    )
    assert out["payment_history"][-1]["amount"] == 100 and out["nonfree_baggages"] == 0


def test_update_flights_and_passengers(env):
    reservation = next(
        r
        for r in env.tools.db.reservations.values()
        if r.status is None
        and any(m.source == "credit_card" for m in env.tools.db.users[r.user_id].payment_methods.values())
    )
    card = method(env.tools.db.users[reservation.user_id], "credit_card")
    same = [{"flight_number": f.flight_number, "date": f.date} for f in reservation.flights]
    paid = len(reservation.payment_history)
    out = call(
        env,
        "update_reservation_flights",
        reservation_id=reservation.reservation_id,
        cabin=reservation.cabin,
        flights=same,
        payment_id=card.id,
    )
    assert len(out["payment_history"]) == paid  # unchanged flights cost nothing
    assert (
        call(
            env,
            "update_reservation_flights",
            reservation_id=reservation.reservation_id,
            cabin=reservation.cabin,
            flights=[{"flight_number": "HAT999", "date": "2024-05-20"}],
            payment_id=card.id,
        )
        == "Error: Flight HAT999 not found"
    )
    count = len(reservation.passengers)
    assert (
        call(
            env,
            "update_reservation_passengers",
            reservation_id=reservation.reservation_id,
            passengers=[{"first_name": "A", "last_name": "B", "dob": "1990-01-01"}] * (count + 1),
        )
        == "Error: Number of passengers does not match"
    )
    out = call(
        env,
        "update_reservation_passengers",
        reservation_id=reservation.reservation_id,
        passengers=[{"first_name": "A", "last_name": "B", "dob": "1990-01-01"}] * count,
    )
    assert [p["first_name"] for p in out["passengers"]] == ["A"] * count


def test_cancel_refunds_every_payment_and_keeps_the_seats(env):
    reservation = next(r for r in env.tools.db.reservations.values() if r.status is None)
    leg = reservation.flights[0]
    day = env.tools.db.flights[leg.flight_number].dates[leg.date]
    seats = dict(getattr(day, "available_seats", {}) or {})
    payments = [p.model_dump() for p in reservation.payment_history]
    out = call(env, "cancel_reservation", reservation_id=reservation.reservation_id)
    assert out["status"] == "cancelled"
    assert out["payment_history"] == payments + [
        {"payment_id": p["payment_id"], "amount": -p["amount"]} for p in payments
    ]
    assert dict(getattr(day, "available_seats", {}) or {}) == seats  # upstream does not release seats
    assert call(env, "cancel_reservation", reservation_id="ZZZZZZ") == "Error: Reservation ZZZZZZ not found"
