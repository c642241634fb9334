"""The databases of the three domains as pydantic models, field for field as upstream.

The models are the schema the tools act on, so they keep upstream's class names, field
order, field types and defaults: tool outputs are ``json.dumps(model.model_dump())``
(field order is visible to the agent), the database hash is taken over ``model_dump()``
(an int stored in a float field hashes as ``100.0``), and validation errors raised when a
tool builds a record are shown to the agent verbatim (they name the class). Only the
top-level databases forbid unknown keys, as upstream.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class StrictDB(BaseModel):
    """A domain database: unknown top-level keys are a data error."""

    model_config = ConfigDict(extra="forbid")


# ----------------------------------------------------------------------------- retail


class Variant(BaseModel):
    item_id: str
    options: dict[str, str]
    available: bool
    price: float


class Product(BaseModel):
    name: str
    product_id: str
    variants: dict[str, Variant]


class UserName(BaseModel):
    first_name: str
    last_name: str


class UserAddress(BaseModel):
    address1: str
    address2: str
    city: str
    country: str
    state: str
    zip: str


class PaymentMethodBase(BaseModel):
    source: str
    id: str


class CreditCard(PaymentMethodBase):
    source: Literal["credit_card"]
    brand: str
    last_four: str


class Paypal(PaymentMethodBase):
    source: Literal["paypal"]


class GiftCard(PaymentMethodBase):
    source: Literal["gift_card"]
    balance: float
    id: str


class User(BaseModel):
    user_id: str
    name: UserName
    address: UserAddress
    email: str
    payment_methods: dict[str, CreditCard | GiftCard | Paypal]
    orders: list[str]


class OrderFullfilment(BaseModel):  # sic: upstream's class name
    tracking_id: list[str]
    item_ids: list[str]


class OrderItem(BaseModel):
    name: str
    product_id: str
    item_id: str
    price: float
    options: dict[str, str]


class OrderPayment(BaseModel):
    transaction_type: Literal["payment", "refund"]
    amount: float
    payment_method_id: str


OrderStatus = Literal[
    "processed",
    "pending",
    "pending (item modified)",
    "delivered",
    "cancelled",
    "exchange requested",
    "return requested",
]


class Order(BaseModel):
    order_id: str
    user_id: str
    address: UserAddress
    items: list[OrderItem]
    status: OrderStatus
    fulfillments: list[OrderFullfilment]
    payment_history: list[OrderPayment]
    cancel_reason: Literal["no longer needed", "ordered by mistake"] | None = None
    exchange_items: list[str] | None = None
    exchange_new_items: list[str] | None = None
    exchange_payment_method_id: str | None = None
    exchange_price_difference: float | None = None
    return_items: list[str] | None = None
    return_payment_method_id: str | None = None


class RetailDB(StrictDB):
    products: dict[str, Product]
    users: dict[str, User]
    orders: dict[str, Order]


# ----------------------------------------------------------------------------- airline

FlightType = Literal["round_trip", "one_way"]
CabinClass = Literal["business", "economy", "basic_economy"]
Insurance = Literal["yes", "no"]


class AirportCode(BaseModel):
    iata: str
    city: str


class Name(BaseModel):
    first_name: str
    last_name: str


class Address(BaseModel):
    address1: str
    address2: str | None = None
    city: str
    country: str
    state: str
    zip: str


class Payment(BaseModel):
    payment_id: str = Field(description="Unique identifier for the payment")
    amount: int = Field(description="Payment amount in dollars")


class AirlineCreditCard(PaymentMethodBase):
    source: Literal["credit_card"]
    brand: str
    last_four: str


class AirlineGiftCard(PaymentMethodBase):
    source: Literal["gift_card"]
    amount: float
    id: str


class Certificate(PaymentMethodBase):
    source: Literal["certificate"]
    amount: float


# Upstream's airline classes are also called CreditCard and GiftCard; validation errors of
# these never reach the agent (no tool builds one), so only the schema has to agree.
AirlinePaymentMethod = AirlineCreditCard | AirlineGiftCard | Certificate


class Passenger(BaseModel):
    first_name: str = Field(description="Passenger's first name")
    last_name: str = Field(description="Passenger's last name")
    dob: str = Field(description="Date of birth in YYYY-MM-DD format")


class FlightDateStatusAvailable(BaseModel):
    status: Literal["available"]
    available_seats: dict[CabinClass, int]
    prices: dict[CabinClass, int]


class FlightDataStatusOnTime(BaseModel):
    status: Literal["on time"]
    estimated_departure_time_est: str
    estimated_arrival_time_est: str


class FlightDataStatusFlying(BaseModel):
    status: Literal["flying"]
    actual_departure_time_est: str
    estimated_arrival_time_est: str


class FlightDateStatusLanded(BaseModel):
    status: Literal["landed"]
    actual_departure_time_est: str
    actual_arrival_time_est: str


class FlightDateStatusCancelled(BaseModel):
    status: Literal["cancelled"]


class FlightDateStatusDelayed(BaseModel):
    status: Literal["delayed"]
    estimated_departure_time_est: str
    estimated_arrival_time_est: str


FlightDateStatus = (
    FlightDateStatusAvailable
    | FlightDateStatusLanded
    | FlightDateStatusCancelled
    | FlightDateStatusDelayed
    | FlightDataStatusFlying
    | FlightDataStatusOnTime
)


class FlightBase(BaseModel):
    flight_number: str
    origin: str
    destination: str


class Flight(FlightBase):
    scheduled_departure_time_est: str
    scheduled_arrival_time_est: str
    dates: dict[str, FlightDateStatus]


class DirectFlight(FlightBase):
    status: Literal["available"]
    scheduled_departure_time_est: str
    scheduled_arrival_time_est: str
    date: str | None = None
    available_seats: dict[CabinClass, int]
    prices: dict[CabinClass, int]


class ReservationFlight(FlightBase):
    date: str
    price: int


class FlightInfo(BaseModel):
    flight_number: str = Field(description="Flight number, such as 'HAT001'.")
    date: str = Field(description="The date for the flight in the format 'YYYY-MM-DD', such as '2024-05-01'.")


class AirlineUser(BaseModel):
    user_id: str
    name: Name
    address: Address
    email: str
    dob: str
    payment_methods: dict[str, AirlinePaymentMethod]
    saved_passengers: list[Passenger]
    membership: Literal["gold", "silver", "regular"]
    reservations: list[str]


class Reservation(BaseModel):
    reservation_id: str
    user_id: str
    origin: str
    destination: str
    flight_type: FlightType
    cabin: CabinClass
    flights: list[ReservationFlight]
    passengers: list[Passenger]
    payment_history: list[Payment]
    created_at: str
    total_baggages: int
    nonfree_baggages: int
    insurance: Insurance
    status: Literal["cancelled"] | None = None


class FlightDB(StrictDB):
    flights: dict[str, Flight]
    users: dict[str, AirlineUser]
    reservations: dict[str, Reservation]


# ----------------------------------------------------------------------------- mock

TaskStatus = Literal["pending", "completed"]


class Task(BaseModel):
    task_id: str
    title: str
    description: str | None = None
    status: TaskStatus


class MockUser(BaseModel):
    user_id: str
    name: str
    tasks: list[str]


class MockDB(StrictDB):
    tasks: dict[str, Task]
    users: dict[str, MockUser]


class Notification(BaseModel):
    model_config = ConfigDict(extra="forbid")

    notification_id: str
    message: str
    status: Literal["unread", "read"] = "unread"
    task_id: str | None = None


class MockUserDB(StrictDB):
    notifications: dict[str, Notification] = Field(default_factory=dict)
